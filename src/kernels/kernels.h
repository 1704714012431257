#pragma once

// Internal interface of the kernel layer (not installed).
//
// Fused multi-tensor "unscale + non-finite check" and "check only" over lists
// of gradients. The GradScaler calls these; nothing here knows about
// optimizers or stages.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace torchamp {
namespace kernels {

/// True for the dtypes the CPU kernels handle: float32, float64, bfloat16.
bool cpu_supports(at::ScalarType dtype);

/// For every tensor: `x = x * inv_scale` in place, computed as ATen's
/// `_amp_foreach_non_finite_check_and_unscale_` does (float32 arithmetic for
/// float32 and bfloat16, the latter rounded back to bfloat16 once; float64
/// arithmetic with `double(inv_scale)` for float64), and whether any *input*
/// element was inf or NaN.
///
/// Tensors must be dense CPU tensors of a `cpu_supports` dtype (any mix);
/// contiguous ones are processed in place in one pass, others through a
/// contiguous copy. Work is split across and within tensors with
/// at::parallel_for. When `per_tensor_found` is given it is resized to
/// `tensors.size()` and entry i says whether tensor i held a non-finite value.
/// With inv_scale == 1 nothing is written (a check only).
bool unscale_cpu_(c10::ArrayRef<at::Tensor> tensors, float inv_scale,
                  std::vector<uint8_t>* per_tensor_found = nullptr);

/// Read-only variant: whether any element of any tensor is inf or NaN.
bool check_cpu(c10::ArrayRef<at::Tensor> tensors, std::vector<uint8_t>* per_tensor_found = nullptr);

}  // namespace kernels
}  // namespace torchamp
