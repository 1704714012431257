// Stochastic rounding through ATen ops (see aten_rounding.h).

#include "optim/aten_rounding.h"

#include "kernels/bf16.h"           // kNoiseMultiplier
#include "kernels/optim_kernels.h"  // rounding_key, Mix64

#include <ATen/ops/arange.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isnan.h>

#include <limits>

namespace torchamp {
namespace optim {

namespace {

using kernels::Mix64;

// x >> k on unsigned bits, from ATen's arithmetic shift of a signed type.
at::Tensor shift_right(const at::Tensor& x, int k, int bits) {
  const int64_t mask = (int64_t{1} << (bits - k)) - 1;
  return at::bitwise_right_shift(x, k).bitwise_and_(mask);
}

// Mix64 on an int64 tensor, wrapping as uint64 arithmetic does.
at::Tensor mix64(const at::Tensor& in) {
  at::Tensor x = in.add(static_cast<int64_t>(Mix64::kAdd));
  for (int r = 0; r < 2; ++r) {
    x = at::bitwise_xor(x, shift_right(x, Mix64::kShift[r], 64))
            .mul_(static_cast<int64_t>(Mix64::kMul[r]));
  }
  return at::bitwise_xor(x, shift_right(x, Mix64::kShift[2], 64));
}

// An int64 tensor of keys split into its 32-bit halves, as int32.
RoundingKeys halves(const at::Tensor& keys) {
  return {at::bitwise_and(keys, int64_t{0xffffffff}).to(at::kInt),
          shift_right(keys, 32, 64).to(at::kInt)};
}

}  // namespace

RoundingKeys rounding_keys(uint64_t seed, uint64_t update, int64_t count) {
  at::Tensor keys = at::empty({count}, at::kLong);
  auto* k = keys.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    k[i] = static_cast<int64_t>(kernels::rounding_key(seed, update, static_cast<uint64_t>(i)));
  }
  return halves(keys);
}

RoundingKeys rounding_keys(uint64_t seed, const at::Tensor& update, int64_t count) {
  // rounding_key: mix64(mix64(seed ^ mix64(update)) + index).
  const at::Tensor base = mix64(at::bitwise_xor(mix64(update), static_cast<int64_t>(seed)));
  const at::Tensor index = at::arange(count, update.options());
  return halves(mix64(index.add_(base)));
}

AtenNoise aten_noise(const RoundingKeys& keys, int64_t flat, int64_t numel, c10::Device device,
                     int states) {
  // Element indices as uint32 (kernels' noise32 takes the index's low bits).
  at::Tensor index;
  if (numel <= std::numeric_limits<int32_t>::max()) {
    index = at::arange(numel, at::TensorOptions().dtype(at::kInt).device(device));
  } else {
    index = at::arange(numel, at::TensorOptions().dtype(at::kLong).device(device))
                .bitwise_and_(int64_t{0xffffffff})
                .to(at::kInt);
  }
  // noise32: x = (i ^ key) * kNoiseMultiplier; x ^ (x >> 16).
  const auto noise32 = [&](const at::Tensor& keys_here) {
    // A CPU element is a scalar to ops on any device; another device's moves.
    const at::Tensor key = keys_here.select(0, flat);
    const at::Tensor x = at::bitwise_xor(index, key.is_cpu() ? key : key.to(device))
                             .mul_(static_cast<int32_t>(kernels::kNoiseMultiplier));
    return at::bitwise_xor(x, shift_right(x, 16, 32));
  };
  // As the kernels' NoiseBits: p = a's low half, s0 = a's high half, s1 =
  // b's low half (b hashed only where a second state tensor needs it).
  const at::Tensor a = noise32(keys.low);
  AtenNoise noise{at::bitwise_and(a, 0xffff), {}, {}};
  if (states >= 1) {
    noise.state0 = shift_right(a, 16, 32);
  }
  if (states >= 2) {
    noise.state1 = noise32(keys.high).bitwise_and_(0xffff);
  }
  return noise;
}

void round_stochastically(const at::Tensor& value, const at::Tensor& noise, const at::Tensor& dst) {
  // float_to_bf16_stochastic: (bits + noise) >> 16, NaN -> 0x7FC0.
  at::Tensor rounded = shift_right(value.view(at::kInt).add(noise.view(value.sizes())), 16, 32);
  rounded.masked_fill_(at::isnan(value), 0x7fc0);
  dst.view(at::kShort).copy_(rounded.to(at::kShort));
}

}  // namespace optim
}  // namespace torchamp
