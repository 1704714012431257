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
/// call:
/// - dense contiguous CPU parameters of float32, float64 or bfloat16 (bfloat16
///   computed in float32 and rounded once per stored tensor): torchamp's own
///   vectorised kernels, split across ATen's intra-op threads;
/// - dense contiguous CUDA parameters of those dtypes, with LibTorch 2.4 or
///   later: ATen's multi-tensor `_fused_sgd_`/`_fused_adam_`/`_fused_adamw_`
///   (the kernels behind Python's `fused=True`), one call per param group,
///   device and dtype.
/// Gradients and state must have the parameter's dtype, device and layout.
/// When any parameter with a gradient is not such (sparse gradient, another
/// dtype, CUDA before LibTorch 2.4, another device), the whole step is the
/// base class's own. One optimizer may hold CPU and CUDA parameters.
/// Results equal the base class's within float rounding (the base class
/// rounds after each of its ATen operations; the fused loops keep the
/// intermediate values in registers).
///
/// With `GradScaler::step(opt)` the optimizers take the loss scale
/// themselves (`StepSupportsAmpScaling`, torchamp/amp_step.h, Python's
/// `_step_supports_amp_scaling`): the scaler finds overflow with a check pass
/// (read-only on the CPU; on CUDA ATen's unscale kernel with an inverse scale
/// of 1, as Python's scaler does for fused optimizers) and hands over the
/// scale and the flag. The update divides each gradient by the scale as it
/// reads it and writes it back divided, in the same pass: after a scaled step
/// the gradients are unscaled on every device, as with Python's fused
/// optimizers. A skipped step changes nothing (the gradients stay scaled).
/// Call `scaler.unscale_(opt)` first to work on real gradients (clipping); the
/// step then does not unscale them again.
///
/// float16 parameters take the fused update too (computed in float32, each
/// stored tensor rounded once, as bfloat16), so the scaler can hand them the
/// scale (Python's fused path accepts float16 gradients).
///
/// Master weights (`FusedOptions().master_weights(true)`, Paddle's
/// `multi_precision`): for float16 and bfloat16 parameters the optimizer
/// keeps a float32 master and float32 state, computes the update in float32
/// against the master and writes the parameter as the master rounded. A
/// bfloat16 parameter's master is the parameter's own 16 bits plus a 16-bit
/// remainder (TransformerEngine's scheme: exactly a float32 master, 2 bytes
/// per parameter; the parameter is the master rounded to nearest, ties away
/// from zero); a float16 parameter's is a float32 copy (4 bytes; rounded to
/// nearest even). Masters are made at a parameter's first step and are
/// optimizer state: `save`/`load` (and so `torch::save`/`torch::load`)
/// carry them exactly. A value written into a float16 parameter outside the
/// optimizer is overwritten by its master at the next step. With master
/// weights every step must be fused: a float16/bfloat16 parameter on CUDA, or
/// any gradient the fused update cannot take, throws
/// `c10::NotImplementedError` (from `step`, `supports_amp_scaling` and so
/// `GradScaler::step`) before anything changes.
///
/// ATen's own fused ops are not used on the CPU: they take a float step
/// tensor per parameter (the base class keeps an int64 count), read gradients
/// by raw pointer whatever their strides, and fused SGD on bfloat16 is broken in
/// LibTorch 2.13 (pytorch/pytorch#191763). On CUDA the base class's int64
/// step counts stay the state (so checkpoints are unchanged); each step
/// hands ATen a float32 copy of them on the device.

#include <torchamp/config.h>

#include <torchamp/amp_step.h>

#include <torch/arg.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>

namespace torchamp {
namespace optim {

/// torchamp's own options of a fused optimizer, beside LibTorch's:
/// `AdamW opt(params, AdamWOptions(1e-3), FusedOptions().master_weights(true));`
struct FusedOptions {
  /// float32 master weights and state for float16 and bfloat16 parameters
  /// (Paddle's `multi_precision`). Default false: parameters of every dtype
  /// are updated in their own storage, as LibTorch's optimizers.
  TORCH_ARG(bool, master_weights) = false;
};

/// The float32 master weights of a fused optimizer (its part of the state).
/// Internal: reach them through the optimizers' `master_weight(param)`.
class MasterWeights {
 public:
  explicit MasterWeights(bool on = false);
  ~MasterWeights();
  MasterWeights(const MasterWeights& other) = delete;
  MasterWeights& operator=(const MasterWeights& other) = delete;
  bool on() const { return on_; }
  struct Store;
  Store& store() const { return *store_; }

 private:
  bool on_;
  std::unique_ptr<Store> store_;
};

/// What a fused optimizer keeps between steps so that its per-parameter
/// bookkeeping is a small constant: each parameter's state key (computed
/// once, not per step) and the state it last validated, checked again on
/// every step before anything is written (a new or replaced parameter, a
/// `load()`, a state entry or state tensor replaced by the user or by
/// LibTorch all show). Not the optimizer's state: `save`/`load` and
/// checkpoints are the base class's. A copy starts empty. It holds
/// references to the parameters and state tensors it last validated, so a
/// parameter removed or a state replaced stays allocated until the next step
/// (or the optimizer's end).
class StepCache {
 public:
  StepCache();
  ~StepCache();
  StepCache(const StepCache& other);
  StepCache& operator=(const StepCache& other);
  struct Plan;
  Plan& plan() const { return *plan_; }

 private:
  std::unique_ptr<Plan> plan_;
};

// Each class below: `step()` is the fused step when `supports_amp_scaling()`,
// else the base class's; `supports_amp_scaling()` says whether the fused
// update can take this step's gradients (all dense, contiguous tensors of the
// parameters' own supported dtype and device, as the parameters and state:
// CPU, or CUDA with LibTorch 2.4+); `amp_step(args)` is one fused step with
// the scaler's scale and flag (torchamp/amp_step.h), and requires
// `supports_amp_scaling()`. `supports_amp_scaling()` walks the parameters
// once, validating what the cache kept and preparing the update;
// `amp_step()` right after it (as GradScaler::step and step() call them)
// uses what it prepared instead of walking again, and walks itself when
// called alone.

/// `torch::optim::SGD` with a fused step.
class SGD : public torch::optim::SGD, public StepSupportsAmpScaling {
 public:
  using torch::optim::SGD::SGD;
  SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
      torch::optim::SGDOptions defaults, FusedOptions fused);
  SGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults, FusedOptions fused);
  at::Tensor step(LossClosure closure = nullptr) override;
  bool supports_amp_scaling() const override;
  void amp_step(const AmpStepArgs& args) override;
  /// The base class's state, then the master weights (when on).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads and checks the master weights first, then loads the base class's
  /// state. Throws `c10::ValueError`, changing nothing, for an archive with
  /// master weights into an optimizer without them or the reverse, or a
  /// master that does not fit its parameter (dtype, size).
  void load(torch::serialize::InputArchive& archive) override;
  FusedOptions fused_options() const { return FusedOptions().master_weights(masters_.on()); }
  /// `param`'s float32 master (a new tensor, bit-exact); undefined before
  /// its first step or without master weights.
  at::Tensor master_weight(const at::Tensor& param) const;
  /// What is stored for `param`'s master: the int16 remainder (bfloat16) or
  /// the float32 copy (float16), shared, not a copy; undefined when none.
  at::Tensor master_weight_storage(const at::Tensor& param) const;

 private:
  StepCache cache_;
  MasterWeights masters_;
};

/// `torch::optim::Adam` with a fused step.
class Adam : public torch::optim::Adam, public StepSupportsAmpScaling {
 public:
  using torch::optim::Adam::Adam;
  Adam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
       torch::optim::AdamOptions defaults, FusedOptions fused);
  Adam(std::vector<at::Tensor> params, torch::optim::AdamOptions defaults, FusedOptions fused);
  at::Tensor step(LossClosure closure = nullptr) override;
  bool supports_amp_scaling() const override;
  void amp_step(const AmpStepArgs& args) override;
  /// The base class's state, then the master weights (when on).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads and checks the master weights first, then loads the base class's
  /// state. Throws `c10::ValueError`, changing nothing, for an archive with
  /// master weights into an optimizer without them or the reverse, or a
  /// master that does not fit its parameter (dtype, size).
  void load(torch::serialize::InputArchive& archive) override;
  FusedOptions fused_options() const { return FusedOptions().master_weights(masters_.on()); }
  /// `param`'s float32 master (a new tensor, bit-exact); undefined before
  /// its first step or without master weights.
  at::Tensor master_weight(const at::Tensor& param) const;
  /// What is stored for `param`'s master: the int16 remainder (bfloat16) or
  /// the float32 copy (float16), shared, not a copy; undefined when none.
  at::Tensor master_weight_storage(const at::Tensor& param) const;

 private:
  StepCache cache_;
  MasterWeights masters_;
};

/// `torch::optim::AdamW` with a fused step.
class AdamW : public torch::optim::AdamW, public StepSupportsAmpScaling {
 public:
  using torch::optim::AdamW::AdamW;
  AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
        torch::optim::AdamWOptions defaults, FusedOptions fused);
  AdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults, FusedOptions fused);
  at::Tensor step(LossClosure closure = nullptr) override;
  bool supports_amp_scaling() const override;
  void amp_step(const AmpStepArgs& args) override;
  /// The base class's state, then the master weights (when on).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads and checks the master weights first, then loads the base class's
  /// state. Throws `c10::ValueError`, changing nothing, for an archive with
  /// master weights into an optimizer without them or the reverse, or a
  /// master that does not fit its parameter (dtype, size).
  void load(torch::serialize::InputArchive& archive) override;
  FusedOptions fused_options() const { return FusedOptions().master_weights(masters_.on()); }
  /// `param`'s float32 master (a new tensor, bit-exact); undefined before
  /// its first step or without master weights.
  at::Tensor master_weight(const at::Tensor& param) const;
  /// What is stored for `param`'s master: the int16 remainder (bfloat16) or
  /// the float32 copy (float16), shared, not a copy; undefined when none.
  at::Tensor master_weight_storage(const at::Tensor& param) const;

 private:
  StepCache cache_;
  MasterWeights masters_;
};

}  // namespace optim
}  // namespace torchamp
