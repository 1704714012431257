// Stochastic rounding through ATen ops (see aten_rounding.h).

#include "optim/aten_rounding.h"

#include "compat/capture.h"         // capturing
#include "compat/compat.h"          // foreach_copy_
#include "kernels/bf16.h"           // kNoiseMultiplier
#include "kernels/optim_kernels.h"  // rounding_key, Mix64
#include "optim/flat_tensors.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/repeat_interleave.h>

#include <algorithm>

namespace torchamp {
namespace optim {

namespace {

using kernels::Mix64;

// The rounding layouts an optimizer keeps (one a fused call: a large
// model's parameters take many calls): beyond these, the parameters with
// gradients change from step to step, and new ones are made each step.
constexpr size_t kKeptLayouts = 4096;

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

at::Tensor rounding_layout(const std::vector<int64_t>& flats, const std::vector<int64_t>& numels,
                           c10::Device device) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(device);
  std::vector<at::Tensor> values;
  values.reserve(flats.size() + numels.size());
  for (const std::vector<int64_t>* list : {&flats, &numels}) {
    for (const int64_t v : *list) {
      values.push_back(at::full({1}, v, options));
    }
  }
  return at::cat(values);
}

AtenNoise aten_noise(const RoundingKeys& keys, const at::Tensor& layout, int64_t total,
                     int states) {
  // Keys on another device would be a copy (from the host, a sync).
  TORCH_INTERNAL_ASSERT(keys.low.device() == layout.device());
  const int64_t n = layout.numel() / 2;
  const at::Tensor flats = layout.narrow(0, 0, n);
  const at::Tensor numels = layout.narrow(0, n, n);
  // Each element's parameter (0 to n-1), and its index in that parameter as
  // uint32 (the kernels' noise32 takes the index's low bits).
  const at::Tensor owner = at::repeat_interleave(numels, c10::optional<int64_t>(total));
  const at::Tensor starts = at::cumsum(numels, 0).sub_(numels);
  const at::Tensor index = at::arange(total, layout.options())
                               .sub_(starts.index_select(0, owner))
                               .bitwise_and_(int64_t{0xffffffff})
                               .to(at::kInt);
  // noise32: x = (i ^ key) * kNoiseMultiplier; x ^ (x >> 16), each element
  // with its parameter's key.
  const auto noise32 = [&](const at::Tensor& keys_here) {
    const at::Tensor key = keys_here.index_select(0, flats).index_select(0, owner);
    const at::Tensor x =
        at::bitwise_xor(index, key).mul_(static_cast<int32_t>(kernels::kNoiseMultiplier));
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

at::Tensor stochastic_bits(const at::Tensor& value, const at::Tensor& noise) {
  // float_to_bf16_stochastic: (bits + noise) >> 16, NaN -> 0x7FC0.
  at::Tensor rounded = shift_right(value.view(at::kInt).add(noise.view(value.sizes())), 16, 32);
  rounded.masked_fill_(at::isnan(value), 0x7fc0);
  return rounded.to(at::kShort);
}

void AtenRounding::add(int64_t flat, const at::Tensor& param, const at::Tensor& grad) {
  flats_.push_back(flat);
  params_.push_back(param);
  grads_.push_back(grad);
}

size_t AtenRounding::add_state(const at::Tensor& stored) {
  size_t k = 0;
  while (k < states_.size() && states_[k].size() == params_.size()) {
    ++k;
  }
  if (k == states_.size()) {
    states_.emplace_back();
  }
  states_[k].push_back(stored);
  return k;
}

void AtenRounding::join() {
  TORCH_INTERNAL_ASSERT(flat_states32_.empty(), "AtenRounding::join twice");
  if (params_.empty()) {
    return;
  }
  flat_params32_ = flat(params_).to(at::kFloat);
  params32_ = pieces(flat_params32_, params_);
  grads32_ = pieces(flat(grads_).to(at::kFloat), grads_);
  for (const std::vector<at::Tensor>& kth : states_) {
    // One optimizer's options: every parameter of a call has the same state.
    TORCH_INTERNAL_ASSERT(kth.size() == params_.size());
    flat_states32_.push_back(flat(kth).to(at::kFloat));
    states32_.push_back(pieces(flat_states32_.back(), kth));
  }
}

void AtenRounding::write_back(const RoundingKeys& keys, bool unscaled,
                              std::map<std::vector<int64_t>, at::Tensor>& layouts) const {
  if (params_.empty()) {
    return;
  }
  const c10::Device device = params_.front().device();
  std::vector<int64_t> numels;
  numels.reserve(params_.size());
  for (const at::Tensor& p : params_) {
    numels.push_back(p.numel());
  }
  std::vector<int64_t> name{static_cast<int64_t>(device.type()), device.index()};
  name.insert(name.end(), flats_.begin(), flats_.end());
  name.insert(name.end(), numels.begin(), numels.end());
  at::Tensor layout;
  const auto known = layouts.find(name);
  if (known != layouts.end()) {
    layout = known->second;
  } else {
    layout = rounding_layout(flats_, numels, device);
    // One made while a graph captures holds its values only once replayed;
    // a full cache keeps its layouts (a captured graph may read them).
    if (layouts.size() < kKeptLayouts && !compat::capturing(device)) {
      layouts.emplace(std::move(name), layout);
    }
  }
  const AtenNoise noise = aten_noise(keys, layout, flat_params32_.numel(),
                                     static_cast<int>(std::min<size_t>(states_.size(), 2)));
  compat::foreach_copy_(as_short(params_),
                        pieces(stochastic_bits(flat_params32_, noise.param), params_));
  for (size_t k = 0; k < states_.size(); ++k) {
    const at::Tensor bits =
        stochastic_bits(flat_states32_[k], k == 0 ? noise.state0 : noise.state1);
    compat::foreach_copy_(as_short(states_[k]), pieces(bits, states_[k]));
  }
  if (unscaled) {
    compat::foreach_copy_(grads_, grads32_);
  }
}

}  // namespace optim
}  // namespace torchamp
