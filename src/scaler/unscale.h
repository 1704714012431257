#pragma once

// The GradScaler's general unscale paths (not installed): every gradient
// validated with typed errors; on the host path (every gradient on the CPU)
// through torchamp's fused kernels; on a scaler whose state lives on a device
// per device and dtype through ATen's
// _amp_foreach_non_finite_check_and_unscale_ (CUDA bfloat16 tensor by tensor
// with plain ATen ops). The cached CPU path is grad_cache.h.

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
}  // namespace torch

namespace torchamp {
namespace detail {

/// "param_groups[G].params[I]", as errors name a parameter.
std::string param_name(size_t group, size_t index);

/// A parameter with a gradient, and where it sits in the optimizer.
struct GradRef {
  at::Tensor param;
  size_t group;
  size_t index;
};

/// Every gradient of the optimizer, validated: throws (and changes nothing) on
/// the first one the scaler cannot unscale (c10::ValueError for float16
/// unless `allow_fp16`, c10::NotImplementedError for other dtypes and layouts).
std::vector<GradRef> checked_grads(torch::optim::Optimizer& optimizer, bool allow_fp16);

/// The sum of the squares of every gradient's elements (sparse: of the
/// values), in double: the general path's counterpart of
/// SpanList::check_sum_squares. One read per tensor (and a host sync on other
/// devices).
double sum_squares(const std::vector<GradRef>& grads);

/// The host path's gradients, every one on the CPU, as torchamp's kernels
/// take them (sparse ones coalesced, in the parameter, and their values
/// taken); `cpu_ref` maps each back to its position in the GradRef list.
/// Gradients on another device take unscale_on_devices: the scaler's state
/// moves there.
struct Buckets {
  std::vector<at::Tensor> cpu;
  std::vector<size_t> cpu_ref;
};

Buckets bucket_grads(const std::vector<GradRef>& grads);

/// Multiplies every gradient by `inv_scale` (none: a check only, nothing
/// written) and returns, per GradRef, whether it held an inf/NaN.
std::vector<uint8_t> unscale_buckets(Buckets& b, size_t n, std::optional<float> inv_scale);

bool any_of(const std::vector<uint8_t>& flags);

/// A device scaler's unscale (GradScaler with its state on a device): per
/// device and dtype ATen's `_amp_foreach_non_finite_check_and_unscale_` (on
/// the CPU, and on CUDA but for bfloat16), else ATen ops per tensor; sparse
/// gradients coalesced first. `inv_scale` (float32, 0-dim) undefined: a
/// check only. Returns one float32 0-dim flag per device of the gradients (0:
/// all finite), and reads nothing back to the host.
std::vector<at::Tensor> unscale_on_devices(const std::vector<GradRef>& grads,
                                           const at::Tensor& inv_scale);

/// `tensors` by device and dtype (the lists ATen's multi-tensor ops take):
/// the groups in order of first appearance, each in the given order.
std::vector<std::vector<at::Tensor>> by_device_and_dtype(const std::vector<at::Tensor>& tensors);

/// `sum_squares` as a 0-dim float64 tensor on `device`, with no host read:
/// the squares of the dense gradients' float64 norms (one multi-tensor op
/// per device and dtype where `_foreach_norm` takes a dtype, LibTorch 2.1
/// on; before, a norm each), a sparse one's values on their own; its last
/// bits may differ from `sum_squares`', the float32 norm made from it only
/// at a rounding boundary.
at::Tensor sum_squares_on(const std::vector<GradRef>& grads, c10::Device device);

}  // namespace detail
}  // namespace torchamp
