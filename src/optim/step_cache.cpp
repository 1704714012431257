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

[[noreturn]] void refuse_unfusable(size_t group, size_t index, const at::Tensor& p,
                                   const at::Tensor& grad, const char* what, bool stochastic) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "torchamp::optim with ", stochastic ? "stochastic rounding" : "master weights",
      ": param_groups[", group, "].params[", index, "] (", p.scalar_type(), " on ", p.device(),
      ") cannot take the fused update: its ", what, " (gradient ", grad.scalar_type(), ", ",
      grad.layout(),
      grad.layout() == at::kStrided && !grad.is_contiguous() ? ", not contiguous" : "", "). ",
      stochastic ? "Stochastic rounding needs dense contiguous bfloat16 parameters on the CPU or "
                   "(LibTorch >= 2.4) CUDA, gradients of the parameter's dtype, and state of "
                   "the parameter's dtype."
                 : "Master weights need dense contiguous parameters on the CPU or (LibTorch "
                   ">= 2.4) CUDA, gradients of the parameter's dtype, and state of float32 "
                   "(float16/bfloat16 parameters) or the parameter's dtype.");
}

[[noreturn]] void refuse_stochastic(size_t group, size_t index, const at::Tensor& p) {
  TORCH_CHECK_VALUE(false, "torchamp::optim with stochastic rounding: param_groups[", group,
                    "].params[", index, "] is ", p.scalar_type(),
                    "; stochastic rounding applies to bfloat16 parameters only (float32 ones "
                    "need no rounding; float16 ones: FusedOptions().master_weights(true)). "
                    "Nothing was changed.");
}

}  // namespace optim
}  // namespace torchamp
