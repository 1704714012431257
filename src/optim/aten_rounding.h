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

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace torchamp {
namespace optim {

// The noise keys of parameters 0..count-1 (their flat index in param-group
// order) at one update, kernels::rounding_key(seed, update, flat) split into
// the two 32-bit halves the kernels' Noise takes: int32 tensors of `count`
// elements. From a host count they are CPU tensors; from a count in a
// tensor (an int64 0-dim tensor: on a device where a device scaler's flag
// decides whether a step counts, and only the device knows; or a host
// count filled into one there), tensors on its device, computed there
// without a host read or copy.
struct RoundingKeys {
  at::Tensor low, high;
};
RoundingKeys rounding_keys(uint64_t seed, uint64_t update, int64_t count);
RoundingKeys rounding_keys(uint64_t seed, const at::Tensor& update, int64_t count);

// The noise of several parameters' elements laid end to end: parameter j
// (key `flats[j]` of `keys`) has `numels[j]` elements, each with its noise
// as a parameter alone would have it: 16 bits an element for the parameter
// and for each of its state's tensors, as the CPU kernels' NoiseBits (int32
// tensors of `total` elements, the numels' sum). Only the first `states` (0
// to 2) state noises are made: the others stay undefined. `layout`
// (rounding_layout) names the parameters on the noise's device, which is
// the keys' too.
struct AtenNoise {
  at::Tensor param, state0, state1;
};
AtenNoise aten_noise(const RoundingKeys& keys, const at::Tensor& layout, int64_t total, int states);

// The flats, then the numels, as an int64 tensor on `device`, made there by
// fills (no copy from the host: it may be made while a CUDA graph captures).
at::Tensor rounding_layout(const std::vector<int64_t>& flats, const std::vector<int64_t>& numels,
                           c10::Device device);

// The bfloat16 bits (int16, `value`'s shape) of float32 `value` rounded
// stochastically with `noise` (one element each, in order); NaN gives
// 0x7FC0.
at::Tensor stochastic_bits(const at::Tensor& value, const at::Tensor& noise);

// The parameters that round stochastically in one ATen fused call, beside
// AtenMasters: join() makes float32 copies of the bfloat16 parameters,
// gradients and state tensors, as views of flat buffers; the call updates
// those; write_back() rounds them back, the noise made for all at once. A
// fixed number of ops a call, not a few dozen a parameter.
class AtenRounding {
 public:
  // A bfloat16 parameter with noise key `flat`, and its gradient.
  void add(int64_t flat, const at::Tensor& param, const at::Tensor& grad);
  // A bfloat16 state tensor of the parameter added last (its next one);
  // returns its index among that parameter's state tensors.
  size_t add_state(const at::Tensor& stored);
  size_t size() const { return params_.size(); }

  // The float32 copies the call takes (each shaped as its tensor): of
  // parameter i, its gradient, and its k-th state tensor.
  void join();
  const at::Tensor& param32(size_t i) const { return params32_.at(i); }
  const at::Tensor& grad32(size_t i) const { return grads32_.at(i); }
  const at::Tensor& state32(size_t i, size_t k) const { return states32_.at(k).at(i); }

  // After the call: the parameters and state tensors rounded with this
  // step's `keys` (the noise: the parameter's, then the state's first
  // tensor's and its second's, AMSGrad's max taking the second's too), and
  // when the call unscaled (`unscaled`) the gradients rounded back to
  // nearest. `layouts` keeps each set of parameters' rounding_layout
  // between steps (made again only where the set changes).
  void write_back(const RoundingKeys& keys, bool unscaled,
                  std::map<std::vector<int64_t>, at::Tensor>& layouts) const;

 private:
  std::vector<int64_t> flats_;
  std::vector<at::Tensor> params_, grads_;
  std::vector<std::vector<at::Tensor>> states_;  // [k]: each parameter's k-th
  at::Tensor flat_params32_;
  std::vector<at::Tensor> flat_states32_;
  std::vector<at::Tensor> params32_, grads32_;
  std::vector<std::vector<at::Tensor>> states32_;
};

}  // namespace optim
}  // namespace torchamp
