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
/// Each class derives from the LibTorch optimizer of the same name and is
/// constructed like it; options, param groups, state and `save`/`load` are
/// the base class's, so checkpoints move both ways between the two (but for
/// master weights and stochastic rounding, whose archives add their entry
/// and are refused by an optimizer without the same option). `step()`
/// is one fused pass over many parameters (CPU: torchamp's kernels; CUDA with
/// LibTorch 2.4+: ATen's `_fused_*_`, master weights included), else the base
/// class's step. With
/// `GradScaler::step(opt)` the update takes the scale and the found-inf flag
/// (`torchamp/amp_step.h`) and leaves the gradients unscaled, as Python's
/// fused optimizers. `FusedOptions().master_weights(true)`: float32 masters
/// for float16/bfloat16 parameters (Paddle's `multi_precision`), carried by
/// `save`/`load`; `FusedOptions().stochastic_rounding(true)`: bfloat16
/// parameters and state rounded stochastically, no masters (half the
/// optimizer memory). The details, and how each differs from Python:
/// docs/optimizers.md.

#include <torchamp/config.h>

#include <torchamp/amp_step.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>
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
  /// bfloat16 parameters without master weights: each update is computed in
  /// float32 and written back to the parameter and its (bfloat16) state with
  /// stochastic rounding, so that updates smaller than half a bfloat16 step
  /// are kept on average instead of lost. `c10::ValueError` at construction
  /// with `master_weights`, or for a parameter that is not bfloat16 (at the
  /// step for one cast later). On the CPU in torchamp's kernels; on CUDA
  /// (LibTorch >= 2.4) as ATen ops around ATen's fused update, with the same
  /// noise and rounding (a device scaler's steps keep the count on the
  /// device: no host read). At the step, `c10::NotImplementedError` for a
  /// parameter elsewhere or a sparse or non-contiguous gradient.
  TORCH_ARG(bool, stochastic_rounding) = false;
  /// With `stochastic_rounding`: the dtype of the optimizer's state (Adam's
  /// moments, SGD's momentum buffer). Unset or `torch::kBFloat16`: the
  /// parameter's, bfloat16, rounded stochastically as the parameter is (8
  /// bytes a parameter with AdamW); `torch::kFloat`: float32, kept exactly
  /// (12 bytes), for when bfloat16 moments cost accuracy. `c10::ValueError`
  /// at construction for another dtype, or without `stochastic_rounding`
  /// (master weights keep float32 state already). An archive whose state has
  /// the other dtype loads, and its step is a `c10::NotImplementedError`
  /// naming the parameter.
  TORCH_ARG(c10::optional<at::ScalarType>, state_dtype) = c10::nullopt;
  /// The rounding noise's seed. The noise of each update is a function of
  /// the seed, the count of updates rounded so far and the parameter's index
  /// in param-group order, so every rank of a data-parallel job rounds alike
  /// (identical weights, no communication); two optimizers over one model
  /// should take different seeds. `save`/`load` carry the seed and the count
  /// (exact resume): a loaded archive's seed replaces this one.
  TORCH_ARG(uint64_t, seed) = 0;
  /// CPU parameters take the path CUDA ones take: ATen's multi-tensor fused
  /// ops (`_fused_adamw_`, ...), with master weights and stochastic rounding
  /// as ATen ops around them. For tests and comparison (torchamp's own CPU
  /// kernels are faster); the same bits where their float32 updates agree.
  /// `c10::NotImplementedError` at construction on LibTorch < 2.4 (no ATen
  /// fused ops).
  TORCH_ARG(bool, aten_kernels) = false;
};

namespace detail {

/// A fused optimizer's private state: the step cache (each parameter's state
/// key and the state it last validated), the master weights and the
/// stochastic rounding's generator, defined in src/optim/. Not the
/// optimizer's state dict; not copyable.
class FusedState {
 public:
  explicit FusedState(const FusedOptions& options = FusedOptions());
  ~FusedState();
  FusedState(const FusedState& other) = delete;
  FusedState& operator=(const FusedState& other) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

/// The options type of each LibTorch optimizer a fused one derives from.
template <class Base>
struct FusedTraits;
template <>
struct FusedTraits<torch::optim::SGD> {
  using Options = torch::optim::SGDOptions;
};
template <>
struct FusedTraits<torch::optim::Adam> {
  using Options = torch::optim::AdamOptions;
};
template <>
struct FusedTraits<torch::optim::AdamW> {
  using Options = torch::optim::AdamWOptions;
};

}  // namespace detail

/// LibTorch's optimizer `Base` with a fused step; use `SGD`, `Adam`, `AdamW`.
/// `step()` is the fused step when `supports_amp_scaling()`, else the base
/// class's. `supports_amp_scaling()`: whether the fused update takes this
/// step's gradients (dense, contiguous, the parameters' own supported dtype and
/// device), a question that changes nothing; `prepare_amp_step()`, which the
/// scaler calls, gives the same answer and readies the update that
/// `amp_step(args)` right after it uses. With master weights or stochastic rounding a step the
/// fused update cannot take throws instead (the errors of `FusedOptions`), changing nothing.
template <class Base>
class Fused : public Base, public StepSupportsAmpScaling {
 public:
  using Options = typename detail::FusedTraits<Base>::Options;
  using Base::Base;
  Fused(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults,
        FusedOptions fused);
  Fused(std::vector<at::Tensor> params, Options defaults, FusedOptions fused);
  ~Fused() override;
  at::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override;
  bool supports_amp_scaling() const override;
  /// The step's walk: validates the step cache and notes each parameter's
  /// data for the `amp_step` right after it (the scaler calls it).
  bool prepare_amp_step() override;
  void amp_step(const AmpStepArgs& args) override;
  /// true: a device scaler's flag and scale go to ATen's ops as tensors (no
  /// host read; a skipped step is undone on the device, as Python's fused
  /// optimizers do). The base class's step counts of those parameters then
  /// catch up at `save` (and `fused_step_counts_to_host`), not before.
  bool takes_device_args() const override { return true; }
  /// Brings the state's step counts of parameters on ATen's path up to the
  /// device's (one read each); `save` does it first.
  void fused_step_counts_to_host();
  /// The base class's state, then the master weights and the stochastic
  /// rounding's generator (when on).
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Reads and checks the master weights and the rounding's generator first,
  /// then loads the base class's state. Throws `c10::ValueError`, changing
  /// nothing, for an archive with master weights (or stochastic rounding)
  /// into an optimizer without them or the reverse, or a master that does
  /// not fit its parameter (dtype, size).
  void load(torch::serialize::InputArchive& archive) override;
  FusedOptions fused_options() const;
  /// Param group `group`'s learning rate as a 0-dim float32 tensor on its
  /// parameters' device (made from `options().lr()` at the first call, then
  /// the same tensor), which every later step reads instead of
  /// `options().lr()`: write it (`lr_tensor(0).fill_(lr)`) to change the rate
  /// with no host-to-device copy, as a step captured in a CUDA graph needs
  /// (Python: a Tensor `lr` with `fused=True`). ATen's fused ops read it on
  /// the device; torchamp's CPU kernels read its value. `c10::IndexError`
  /// for a group that does not exist.
  at::Tensor lr_tensor(size_t group);
  /// `param`'s float32 master (a new tensor, bit-exact); undefined before
  /// its first step or without master weights.
  at::Tensor master_weight(const at::Tensor& param) const;
  /// What is stored for `param`'s master: the int16 remainder (bfloat16) or
  /// the float32 copy (float16), shared, not a copy; undefined when none.
  at::Tensor master_weight_storage(const at::Tensor& param) const;
  /// Copies `from`'s parameters and buffers into the same-named ones of `to`
  /// (a float32 twin of `from`, for sampling, inference or export): each
  /// parameter's float32 master where this optimizer has one (bit for bit),
  /// else its value, converted to `to`'s dtype. Throws `c10::ValueError`,
  /// changing nothing, naming the first name one module has and the other
  /// lacks, or whose shapes differ.
  void export_float32(const torch::nn::Module& from, torch::nn::Module& to) const;

 private:
  detail::FusedState fused_;
};

extern template class Fused<torch::optim::SGD>;
extern template class Fused<torch::optim::Adam>;
extern template class Fused<torch::optim::AdamW>;

/// `torch::optim::SGD` with a fused step.
using SGD = Fused<torch::optim::SGD>;
/// `torch::optim::Adam` with a fused step.
using Adam = Fused<torch::optim::Adam>;
/// `torch::optim::AdamW` with a fused step.
using AdamW = Fused<torch::optim::AdamW>;

}  // namespace optim
}  // namespace torchamp
