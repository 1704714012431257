#pragma once

/// \file
/// The hook through which `GradScaler::step` hands an optimizer the loss scale
/// instead of unscaling its gradients first: Python's
/// `optimizer._step_supports_amp_scaling = True`, after which the scaler calls
/// `optimizer.step(grad_scale=..., found_inf=...)`. torchamp's fused
/// optimizers (torchamp/optim.h) implement it; so can a user's own.
///
/// ```
/// class MyOptimizer : public torch::optim::Optimizer, public torchamp::StepSupportsAmpScaling {
///   bool supports_amp_scaling() const override { return true; }
///   void amp_step(const torchamp::AmpStepArgs& args) override;  // see AmpStepArgs
///   ...
/// };
/// ```
///
/// The scaler finds this interface with a `dynamic_cast` of the optimizer; it
/// names no optimizer class.

#include <torchamp/config.h>

#include <ATen/core/Tensor.h>

#include <optional>

namespace torchamp {

/// What `GradScaler::step` passes: the two values ATen's fused optimizer ops
/// (`_fused_adam_`, `_fused_sgd_`, ...) take as `grad_scale` and `found_inf`.
struct AmpStepArgs {
  /// The scale the gradients still carry. The update divides each gradient by
  /// it and writes it back divided (so after the step the gradients are real,
  /// as with Python's fused optimizers). `std::nullopt`: the gradients were
  /// already unscaled (`GradScaler::unscale_` ran); use them as they are.
  std::optional<float> grad_scale;
  /// Whether a gradient (on any rank, with a process group) held an inf/NaN.
  /// When true the update must change nothing: parameters, state, step counts
  /// and gradients.
  bool found_inf = false;
  /// From a scaler whose state lives on a device (a CUDA scaler, or
  /// `GradScalerOptions().device_state(true)`), for an optimizer whose
  /// `takes_device_args()` is true: the flag as a float32 0-dim tensor on
  /// that device (0: clean), so that the step makes no host read. Then
  /// `found_inf` and `grad_scale` above are not set: `grad_scale_tensor`
  /// (float32, 0-dim, undefined when the gradients were already unscaled)
  /// replaces `grad_scale`. Undefined otherwise.
  at::Tensor found_inf_tensor{};
  at::Tensor grad_scale_tensor{};
};

/// An optimizer whose step can take gradients still multiplied by the loss
/// scale (Python's `_step_supports_amp_scaling`).
class StepSupportsAmpScaling {
 public:
  virtual ~StepSupportsAmpScaling() = default;

  /// Whether `amp_step` can take this step's gradients: a question, which
  /// changes nothing. When false the scaler treats the optimizer as any
  /// other: it unscales the gradients itself and calls `step()`, or skips it.
  virtual bool supports_amp_scaling() const = 0;

  /// The step's preparation, which the scaler calls (not
  /// `supports_amp_scaling()`) right before it checks the gradients: the
  /// same answer, and an optimizer may ready its `amp_step` here (torchamp's
  /// fused ones validate their step cache and note each parameter's data).
  /// The default only asks `supports_amp_scaling()`.
  virtual bool prepare_amp_step() { return supports_amp_scaling(); }

  /// One step. Called by `GradScaler::step` (once per iteration, only after
  /// `prepare_amp_step()` returned true), with the scale unless `unscale_`
  /// already ran, and with the agreed overflow flag.
  virtual void amp_step(const AmpStepArgs& args) = 0;

  /// Whether `amp_step` reads `found_inf_tensor`/`grad_scale_tensor` when
  /// they are set. false (the default, an optimizer written before they
  /// existed): a device scaler reads its flag and scale back to the host for
  /// it (one sync) and sets `found_inf`/`grad_scale` as always.
  virtual bool takes_device_args() const { return false; }
};

}  // namespace torchamp
