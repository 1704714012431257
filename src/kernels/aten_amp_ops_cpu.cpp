// CPU kernels for ATen's own AMP ops, registered only on LibTorch < 2.3,
// which has none (2.3 added its own; registering ours there would override
// them). With this library loaded, at::_amp_foreach_non_finite_check_and_unscale_
// and at::_amp_update_scale_ work on CPU tensors from C++, and from Python
// after torch.ops.load_library("libtorchamp.so").
//
// The checks and messages are PyTorch 2.3's CPU kernels' (aten/src/ATen/native/
// AmpKernels.cpp); the arithmetic is torchamp's kernels and ScaleSchedule.

#include "compat/compat.h"

#if !TORCHAMP_TORCH_AT_LEAST(2, 3)

#include <torchamp/scale_schedule.h>

#include "kernels.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace torchamp {
namespace kernels {
namespace {

void amp_foreach_non_finite_check_and_unscale_cpu_(at::TensorList scaled_grads,
                                                   at::Tensor& found_inf,
                                                   const at::Tensor& inv_scale) {
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(inv_scale.scalar_type() == at::ScalarType::Float,
              "inv_scale must be a float tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::ScalarType::Float,
              "found_inf must be a float tensor.");
  if (scaled_grads.empty()) {
    return;
  }
  TORCH_CHECK(inv_scale.is_cpu(), "inv_scale must be a CPU tensor.");
  TORCH_CHECK(found_inf.is_cpu(), "found_inf must be a CPU tensor.");
  for (const at::Tensor& t : scaled_grads) {
    TORCH_CHECK(t.is_cpu(), "one of scaled_grads was not a CPU tensor.");
    TORCH_CHECK(t.layout() == at::kStrided, "one of scaled_grads was not a strided tensor.");
    TORCH_CHECK(cpu_supports(t.scalar_type()),
                "_amp_foreach_non_finite_check_and_unscale_ not implemented for '", t.scalar_type(),
                "'");
  }
  if (unscale_cpu_(scaled_grads, inv_scale.item<float>())) {
    found_inf.fill_(1.0);
  }
}

at::Tensor& amp_update_scale_cpu_(at::Tensor& current_scale, at::Tensor& growth_tracker,
                                  const at::Tensor& found_inf, double growth_factor,
                                  double backoff_factor, int64_t growth_interval) {
  TORCH_CHECK(growth_tracker.is_cpu(), "growth_tracker must be a CPU tensor.");
  TORCH_CHECK(current_scale.is_cpu(), "current_scale must be a CPU tensor.");
  TORCH_CHECK(found_inf.is_cpu(), "found_inf must be a CPU tensor.");
  TORCH_CHECK(growth_tracker.numel() == 1, "growth_tracker must be a 1-element tensor.");
  TORCH_CHECK(current_scale.numel() == 1, "current_scale must be a 1-element tensor.");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor.");
  TORCH_CHECK(growth_tracker.scalar_type() == at::ScalarType::Int,
              "growth_tracker must be an int tensor.");
  TORCH_CHECK(current_scale.scalar_type() == at::ScalarType::Float,
              "current_scale must be a float tensor.");
  TORCH_CHECK(found_inf.scalar_type() == at::ScalarType::Float,
              "found_inf must be a float tensor.");
  // PyTorch's rule is the schedule with backoff_interval = 1.
  const auto next = ScaleSchedule::advance(
      {current_scale.item<float>(), growth_tracker.item<int32_t>(), 0},
      found_inf.item<float>() != 0.0f, growth_factor, backoff_factor, growth_interval, 1);
  current_scale.fill_(next.scale);
  growth_tracker.fill_(next.growth_tracker);
  return current_scale;
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, CPU, m) {
  m.impl("_amp_foreach_non_finite_check_and_unscale_",
         TORCH_FN(amp_foreach_non_finite_check_and_unscale_cpu_));
  m.impl("_amp_update_scale_", TORCH_FN(amp_update_scale_cpu_));
}

}  // namespace kernels
}  // namespace torchamp

#endif  // LibTorch < 2.3
