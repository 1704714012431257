#pragma once

// The CPU-speed side of half precision: which dtypes this CPU multiplies
// natively (torchamp::cpu_has_fast) and the one-time warning where autocast
// or a fused optimizer puts CPU matmuls in a dtype it does not.

#include "kernels/kernels.h"

#include <c10/core/ScalarType.h>

#include <string>

namespace torchamp {
namespace detail {

/// cpu_has_fast(dtype) for a given set of CPU features (testable on any CPU).
bool cpu_has_fast(at::ScalarType dtype, const kernels::CpuFeatures& features);

/// The warning's text: `what` says who put matmuls in `dtype`.
std::string slow_cpu_warning(at::ScalarType dtype, const char* what);

/// Gives the warning (TORCH_WARN) where `dtype` is bfloat16 or float16, this
/// CPU has no fast matmuls in it, the warning is on and it has not yet been
/// given for `dtype`.
void warn_if_slow_on_cpu(at::ScalarType dtype, const char* what);

}  // namespace detail
}  // namespace torchamp
