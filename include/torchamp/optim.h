#pragma once

/// \file
/// `torchamp::optim::{SGD, Adam, AdamW}`: LibTorch's optimizers with a fused
/// step that also takes the GradScaler's unscale, the counterpart of Python's
/// `torch.optim.AdamW(..., fused=True)`.
///
/// ```
/// torchamp::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
/// torchamp::GradScaler scaler;
/// scaler.scale(loss).backward();
/// scaler.step(opt);   // one read-only check pass, then the update unscales
/// scaler.update();
/// ```
///
/// Each class derives publicly from the LibTorch optimizer of the same name
/// and is constructed exactly like it; options, param groups, the
/// per-parameter state (types and layout) and `save`/`load` are the base
/// class's, so LR schedulers, `zero_grad`, `torch::save(opt, path)` and
/// `torch::load(opt, path)` work unchanged and checkpoints move both ways
/// between `torch::optim::AdamW` and `torchamp::optim::AdamW`. Every option is
/// honoured (SGD: momentum, dampening, nesterov, weight_decay; Adam/AdamW:
/// betas, eps, weight_decay, amsgrad), per param group.
///
/// `step()` is one pass over each parameter's data (parameter, gradient and
/// state read once, parameter and state written once), many parameters per
/// call, split across ATen's intra-op threads, for dense contiguous CPU
/// parameters of float32, float64 or bfloat16 (bfloat16 computed in float32
/// and rounded once per stored tensor) with gradients and state of the same
/// dtype. When any parameter with a gradient is not such (CUDA, sparse
/// gradient, another dtype), the whole step is the base class's own.
/// Results equal the base class's within float rounding (the base class
/// rounds after each of its ATen operations; the fused loop keeps the
/// intermediate values in registers).
///
/// With `GradScaler::step(opt)`, the scaler finds overflow with a read-only
/// check pass and hands the optimizer the inverse scale: the update reads
/// each gradient, multiplies it by the inverse scale in registers and never
/// writes it, so after a fused scaled step the gradients are still scaled (as
/// they were before `step`). Call `scaler.unscale_(opt)` first to work on real
/// gradients (clipping); the step then does not unscale them again.
///
/// ATen's own `_fused_adam_`/`_fused_adamw_`/`_fused_sgd_` are not used on
/// the CPU: they take a float step tensor per parameter (the base class keeps
/// an int64 count), divide the gradient and write it back (an extra write
/// pass), read gradients by raw pointer whatever their strides, and fused SGD
/// on bfloat16 is broken in LibTorch 2.13 (pytorch/pytorch#191763). CUDA
/// parameters take the base class's step (with the scaler: after it unscaled
/// the gradients on the device).

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace torchamp {
namespace optim {

/// What `GradScaler::step` looks for (by dynamic_cast) in an optimizer that
/// unscales inside its own update.
class FusedStep {
 public:
  virtual ~FusedStep() = default;
  /// Whether the fused update can take this step's gradients (all dense,
  /// contiguous CPU tensors of the parameters' own supported dtype, as the
  /// parameters and state). When false the scaler unscales as for any
  /// optimizer and calls `step()`.
  virtual bool can_fuse() const = 0;
  /// One step with every gradient multiplied by `inv_scale` inside the update
  /// (gradients are not written). Requires `can_fuse()`.
  virtual void fused_step(float inv_scale) = 0;
};

/// `torch::optim::SGD` with a fused step.
class SGD : public torch::optim::SGD, public FusedStep {
 public:
  using torch::optim::SGD::SGD;
  at::Tensor step(LossClosure closure = nullptr) override;
  bool can_fuse() const override;
  void fused_step(float inv_scale) override;
};

/// `torch::optim::Adam` with a fused step.
class Adam : public torch::optim::Adam, public FusedStep {
 public:
  using torch::optim::Adam::Adam;
  at::Tensor step(LossClosure closure = nullptr) override;
  bool can_fuse() const override;
  void fused_step(float inv_scale) override;
};

/// `torch::optim::AdamW` with a fused step.
class AdamW : public torch::optim::AdamW, public FusedStep {
 public:
  using torch::optim::AdamW::AdamW;
  at::Tensor step(LossClosure closure = nullptr) override;
  bool can_fuse() const override;
  void fused_step(float inv_scale) override;
};

}  // namespace optim
}  // namespace torchamp
