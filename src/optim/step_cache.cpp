#include "optim/step_cache.h"

namespace torchamp {
namespace optim {

StepCache::StepCache() : plan_(std::make_unique<Plan>()) {}
StepCache::~StepCache() = default;
StepCache::StepCache(const StepCache& /*other*/) : plan_(std::make_unique<Plan>()) {}
StepCache& StepCache::operator=(const StepCache& other) {
  if (this != &other) {
    plan_ = std::make_unique<Plan>();
  }
  return *this;
}

// A parameter the update must take but cannot (only with master weights: the
// base class's step would ignore them).
[[noreturn]] void refuse_unfusable(size_t group, size_t index, const at::Tensor& p,
                                   const at::Tensor& grad, const char* what) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "torchamp::optim with master weights: param_groups[", group, "].params[", index, "] (",
      p.scalar_type(), " on ", p.device(), ") cannot take the fused update: its ", what,
      " (gradient ", grad.scalar_type(), ", ", grad.layout(),
      grad.layout() == at::kStrided && !grad.is_contiguous() ? ", not contiguous" : "",
      "). Master weights need dense contiguous CPU parameters, gradients of the parameter's "
      "dtype, and state of float32 (float16/bfloat16 parameters) or the parameter's dtype.");
}

}  // namespace optim
}  // namespace torchamp
