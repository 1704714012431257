#pragma once

// Stochastic rounding on the path of ATen's fused ops (CUDA parameters, and
// CPU ones with FusedOptions().aten_kernels): the fused call updates float32
// copies of the bfloat16 parameter and state, and these write them back with
// ATen ops on the tensors' device. The same noise as torchamp's CPU kernels
// (kernels::rounding_key, kernels::noise32) and the same rounding
// (kernels::float_to_bf16_stochastic): one float32 value gives one bfloat16
// pattern on either path. The bit arithmetic is in int32 and int64, whose
// ATen ops wrap as two's complement on every device. Private to src/optim/.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchamp {
namespace optim {

// The noise keys of parameters 0..count-1 (their flat index in param-group
// order) at one update, kernels::rounding_key(seed, update, flat) split into
// the two 32-bit halves the kernels' Noise takes: int32 tensors of `count`
// elements. From a host count they are CPU tensors (ops on any device read
// an element as a scalar); from a count on a device (an int64 0-dim tensor:
// a device scaler's flag decides whether a step counts, and only the device
// knows), tensors on that device, computed there without a host read.
struct RoundingKeys {
  at::Tensor low, high;
};
RoundingKeys rounding_keys(uint64_t seed, uint64_t update, int64_t count);
RoundingKeys rounding_keys(uint64_t seed, const at::Tensor& update, int64_t count);

// One parameter's noise under key `flat` of `keys`, on `device`: 16 bits an
// element for the parameter and for each of its state's tensors, as the CPU
// kernels' NoiseBits (int32 tensors of `numel` elements). Only the first
// `states` (0 to 2) state noises are made: the others stay undefined.
struct AtenNoise {
  at::Tensor param, state0, state1;
};
AtenNoise aten_noise(const RoundingKeys& keys, int64_t flat, int64_t numel, c10::Device device,
                     int states);

// Writes float32 `value` into the bfloat16 tensor `dst` of the same shape,
// rounded stochastically with `noise` (one element each, in order); NaN
// becomes 0x7FC0.
void round_stochastically(const at::Tensor& value, const at::Tensor& noise, const at::Tensor& dst);

}  // namespace optim
}  // namespace torchamp
