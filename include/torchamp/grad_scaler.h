#pragma once

/// \file
/// `torchamp::GradScaler`: dynamic loss scaling for the LibTorch C++ frontend,
/// the counterpart of Python's `torch.amp.GradScaler`.

#include <torchamp/amp_step.h>
#include <torchamp/scale_schedule.h>

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch {
namespace optim {
class Optimizer;
}  // namespace optim
namespace serialize {
class InputArchive;
class OutputArchive;
}  // namespace serialize
}  // namespace torch

namespace torchamp {

/// A scaler's serialisable state: a string-keyed dictionary of IValues, the
/// type `torch::pickle_load(bytes).toGenericDict()` returns. An empty one is
/// `StateDict(c10::StringType::get(), c10::AnyType::get())`.
using StateDict = c10::impl::GenericDict;

/// Options of a `GradScaler`, with chained setters like
/// `torch::optim::AdamOptions`:
/// `GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(100));`
///
/// The first five are Python's `GradScaler(init_scale, growth_factor,
/// backoff_factor, growth_interval, enabled)` with the same defaults.
struct GradScalerOptions {
  /// Initial scale; finite and > 0 as a float32.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Multiplier after `growth_interval` consecutive clean updates; > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Multiplier after `backoff_interval` consecutive overflowing updates; in (0, 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Consecutive clean updates before the scale grows; >= 1.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// Consecutive overflowing updates before the scale backs off; >= 1. 1 is
  /// PyTorch's rule; Paddle's `decr_every_n_nan_or_inf` (default 2) is this.
  TORCH_ARG(int64_t, backoff_interval) = 1;
  /// false: the scale stays fixed (overflowing steps are still skipped).
  TORCH_ARG(bool, dynamic) = true;
  /// false: a transparent pass-through, as Python's `enabled=False`.
  TORCH_ARG(bool, enabled) = true;
  /// The scale never backs off below this; 0 (default, as PyTorch): no floor.
  /// Finite and >= 0.
  TORCH_ARG(double, min_scale) = 0.0;
  /// After this many skipped steps in a row (not interrupted by a clean
  /// update), `step` throws instead of silently not training; 0 (default):
  /// never. >= 0.
  TORCH_ARG(int64_t, max_consecutive_skips) = 0;
  /// true: `unscale_` also unscales float16 gradients (in float32, rounded
  /// once: Paddle's `_unscale`, which the Paddle facade sets). false
  /// (default, as PyTorch): it refuses them.
  TORCH_ARG(bool, unscale_float16) = false;
};

/// A parameter whose gradient held an inf/NaN at the last `unscale_`.
struct NonFiniteGradient {
  size_t group;      ///< index into optimizer.param_groups()
  size_t index;      ///< index into that group's params()
  std::string name;  ///< as registered with register_parameter_names, else empty
};

/// Dynamic loss scaling. The training loop is Python's:
///
/// ```
/// torchamp::GradScaler scaler;
/// optimizer.zero_grad();
/// scaler.scale(loss).backward();
/// scaler.unscale_(optimizer);   // optional: real gradients, e.g. for clipping
/// scaler.step(optimizer);       // skipped when a gradient is inf/NaN
/// scaler.update();              // grow or back off the scale
/// ```
///
/// Each optimizer moves through ready -> unscaled -> stepped once per
/// iteration; `update()` returns every optimizer to ready. Optimizers are
/// identified by address (Python uses `id(optimizer)`).
///
/// Errors are typed as Python's: misuse throws `c10::Error` (RuntimeError),
/// bad values `c10::ValueError`, unsupported gradients
/// `c10::NotImplementedError`. A call that throws changes no state of the
/// scaler.
///
/// Differences from Python: the scale lives on the host as a float32 value
/// (CUDA gradients are still unscaled on the device, with one host
/// synchronisation per device and iteration, when they are unscaled), `step`
/// forwards no extra arguments, and `backoff_interval` and `dynamic` (Paddle
/// has both), `min_scale` and `max_consecutive_skips` are extensions.
class GradScaler {
 public:
  using LossClosure = std::function<at::Tensor()>;

  /// Throws `c10::ValueError` naming the option and value if any option is
  /// out of range, also when `enabled` is false.
  explicit GradScaler(GradScalerOptions options = {});

  /// `output * scale`, exactly Python's: the scale is a 0-dim float32 tensor
  /// (a CPU scalar to ATen, so no host-device copy for a CUDA output), with
  /// ATen's type promotion. A tensor with dimensions keeps its dtype (on
  /// LibTorch 2.13 a bfloat16 one is multiplied by the float32 scale itself
  /// and rounded once, where a C++ Scalar would round the scale to bfloat16
  /// first); a 0-dim float16/bfloat16 loss comes back float32, as in Python.
  /// Disabled: returns `output` itself.
  /// Throws `c10::ValueError` for an undefined tensor, enabled or not.
  at::Tensor scale(const at::Tensor& output);

  /// `scale` applied to each tensor, order kept. Every tensor is checked
  /// before any is scaled.
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Divides (multiplies by the float32 reciprocal of the scale, as ATen) the
  /// gradients of every parameter of every param group in place, and records
  /// whether any held an inf/NaN. float32 and float64 gradients are unscaled
  /// in their own dtype; bfloat16 ones in float32, rounded back once. Sparse
  /// gradients are coalesced and their values unscaled.
  ///
  /// Throws, before anything is unscaled and without changing the stage:
  /// `c10::Error` if `unscale_` or `step` already ran for this optimizer since
  /// the last `update()`; `c10::ValueError` for a float16 gradient;
  /// `c10::NotImplementedError` for a complex or other non-floating gradient
  /// or an unsupported layout. Disabled: does nothing.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Unscales the gradients unless `unscale_` already ran for this optimizer
  /// (never twice), then returns `optimizer.step()`, or `std::nullopt`
  /// without calling it when a gradient was inf/NaN.
  ///
  /// An optimizer that implements `StepSupportsAmpScaling` (torchamp/amp_step.h;
  /// torchamp::optim's do) and says it `supports_amp_scaling()` is not
  /// unscaled here, as Python's `_step_supports_amp_scaling`: one read-only
  /// check pass finds overflow (and the ranks agree, with a reducer), then
  /// `amp_step` gets the scale (none if `unscale_` already ran) and the flag,
  /// and divides the gradients inside its update, writing them back unscaled
  /// (as Python's fused optimizers, on every device). A skipped step changes
  /// nothing: parameters, state, step counts, gradients (still scaled).
  ///
  /// With `max_consecutive_skips` = N > 0, the N-th skipped step in a row
  /// throws `c10::Error` instead, naming the scale, the count and the
  /// parameters with non-finite gradients (the gradients stay unscaled, or
  /// still scaled for an optimizer that unscales in its step; the stage stays
  /// unscaled).
  ///
  /// Throws `c10::Error` if `step` already ran since the last `update()`, or
  /// "No inf checks were recorded for this optimizer." when the optimizer has
  /// no gradient at all; otherwise as `unscale_`, except that an optimizer
  /// that takes the scale may have float16 gradients (Python's fused path;
  /// e.g. torchamp::optim with master weights). Disabled: returns
  /// `optimizer.step()`.
  std::optional<at::Tensor> step(torch::optim::Optimizer& optimizer);

  /// Clips the gradients' total 2-norm to `max_norm` as
  /// `unscale_(opt); torch::nn::utils::clip_grad_norm_(params, max_norm);`
  /// does, and returns the total norm of the real (unscaled) gradients; inf
  /// or NaN when a gradient overflowed (the step is then skipped).
  ///
  /// For an optimizer that takes the scale (`StepSupportsAmpScaling`, e.g.
  /// torchamp::optim's) nothing is written: the check pass that finds
  /// overflow also sums the squares of the still-scaled gradients, and the
  /// clip coefficient (`max_norm / (norm + 1e-6)`, at most 1, as PyTorch's)
  /// is folded into the scale `step` hands over, so the update divides each
  /// gradient by `scale / coefficient` in the pass it makes anyway. This is
  /// also the one way to clip float16 gradients (which `unscale_` refuses).
  /// Any other optimizer: `unscale_`, then one more pass that multiplies by
  /// the coefficient. Disabled: clips the gradients as they are.
  ///
  /// The norm is this process's: with a sharded optimizer every rank must
  /// sum the squares of all shards (not done here). Throws `c10::ValueError`
  /// for a `max_norm` that is negative or not finite; otherwise as `unscale_`
  /// (and only where `unscale_` would for float16 gradients), with nothing
  /// changed.
  double clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm);

  /// Closures are refused while enabled (`c10::Error`): a closure re-runs
  /// backward and its gradients would never be unscaled. Disabled: returns
  /// `optimizer.step(closure)`.
  std::optional<at::Tensor> step(torch::optim::Optimizer& optimizer, LossClosure closure);

  /// Ends the iteration: backs off (after `backoff_interval` consecutive
  /// overflowing updates) if any optimizer's gradients overflowed since the
  /// last update, else counts a clean update (growing after
  /// `growth_interval`); see `ScaleSchedule::update`. With `new_scale` the
  /// scale is set to it directly (validated like `init_scale`), counters
  /// untouched. Either way every optimizer returns to ready.
  ///
  /// Throws `c10::Error` "No inf checks were recorded prior to update." when
  /// no gradient was checked since the last update (and no `new_scale`).
  /// Disabled: does nothing.
  void update(std::optional<double> new_scale = std::nullopt);

  /// The current scale (a float32 value); 1.0 when disabled.
  double get_scale() const;
  bool is_enabled() const { return enabled_; }
  /// The options as they stand now: the constructor's, changed by the
  /// setters and `load_state_dict` (which, as Python, sets `init_scale` to the
  /// loaded scale).
  GradScalerOptions options() const;

  double get_growth_factor() const { return schedule_.growth_factor(); }
  double get_backoff_factor() const { return schedule_.backoff_factor(); }
  int64_t get_growth_interval() const { return schedule_.growth_interval(); }
  int64_t get_backoff_interval() const { return schedule_.backoff_interval(); }
  /// Consecutive clean updates counted so far.
  int64_t get_growth_tracker() const { return schedule_.growth_tracker(); }
  /// Consecutive overflowing updates counted so far.
  int64_t get_backoff_tracker() const { return schedule_.backoff_tracker(); }
  bool is_dynamic() const { return schedule_.dynamic(); }

  double get_min_scale() const { return schedule_.min_scale(); }
  int64_t get_max_consecutive_skips() const { return max_consecutive_skips_; }
  /// Skipped steps since the last clean update.
  int64_t get_consecutive_skips() const { return consecutive_skips_; }

  /// Validated as in the constructor (`c10::ValueError`, nothing changed).
  void set_growth_factor(double growth_factor);
  void set_backoff_factor(double backoff_factor);
  void set_growth_interval(int64_t growth_interval);
  void set_backoff_interval(int64_t backoff_interval);
  void set_min_scale(double min_scale);
  void set_max_consecutive_skips(int64_t max_consecutive_skips);
  /// Sets `init_scale` and resets the current scale to it (validated like
  /// `init_scale`); counters and stages untouched. Paddle's
  /// `set_init_loss_scaling`; Python's GradScaler has no such setter.
  void set_init_scale(double init_scale);

  /// The parameters whose gradients held an inf/NaN at this optimizer's last
  /// `unscale_` (also the one inside `step`), in optimizer order; empty when
  /// none did or none was unscaled. Known from the fused pass itself on the
  /// CPU; for CUDA gradients, found by a per-tensor check run only when the
  /// device reported an overflow.
  std::vector<NonFiniteGradient> non_finite_gradients(
      const torch::optim::Optimizer& optimizer) const;

  /// Names for the diagnostics and the `max_consecutive_skips` error, e.g.
  /// `scaler.register_parameter_names(model->named_parameters())` (anything
  /// iterable whose items have `key()` and `value()`).
  template <class NamedParameters>
  void register_parameter_names(const NamedParameters& named) {
    for (const auto& item : named) {
      register_parameter_name(item.key(), item.value());
    }
  }
  void register_parameter_name(const std::string& name, const at::Tensor& parameter);

  /// How ranks agree on an overflow (see torchamp/distributed.h, which sets
  /// one from a c10d process group). Called by `unscale_` (and `step`) with
  /// this rank's flag for the optimizer and the device of its gradients,
  /// after a read-only check pass and before anything is divided or any stage
  /// changes; its result is what the scaler records. An exception from it
  /// propagates with nothing changed (the stage and the gradients are as
  /// before). It is also called for an optimizer without gradients (with
  /// false), so that peers are not left waiting. Empty: this rank's flag.
  using FoundInfReducer = std::function<bool(bool found_inf, c10::Device device)>;
  void set_found_inf_reducer(FoundInfReducer reducer) { found_inf_reducer_ = std::move(reducer); }
  bool has_found_inf_reducer() const { return static_cast<bool>(found_inf_reducer_); }

  /// PyTorch's keys, so checkpoints cross between Python and C++: `scale`,
  /// `growth_factor`, `backoff_factor` (double), `growth_interval`,
  /// `_growth_tracker` (int), and ours: `backoff_interval`, `_backoff_tracker`
  /// (int), `dynamic` (bool), `min_scale` (double), `max_consecutive_skips`,
  /// `_consecutive_skips` (int). Empty when disabled.
  StateDict state_dict() const;

  /// Loads a `state_dict()` or a dict of one of the other schemas it knows:
  /// Python's GradScaler's (PyTorch's five keys; our six extension keys then
  /// keep their values), Paddle's (`paddle.amp.GradScaler`'s keys), and
  /// lucid's (the reference page's framework: `scale`, `growth_factor`,
  /// `backoff_factor`, `growth_interval`, `growth_tracker`). The keys say which
  /// schema a dict is; one mixing two is refused. Every key's presence, type
  /// and value is checked before anything changes (`c10::ValueError` naming
  /// the key); ints are accepted where doubles are expected. `init_scale`
  /// becomes the loaded scale, as in Python. An empty dict throws `c10::Error`
  /// "The source state dict is empty, possibly because it was saved from a
  /// disabled instance of GradScaler." Unknown keys are ignored. Disabled:
  /// does nothing.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };

  struct OptimizerState {
    Stage stage = Stage::kReady;
    bool checked = false;    // at least one gradient was checked
    bool found_inf = false;  // agreed result (one host sync per device, at unscale)
    bool deferred = false;   // gradients left scaled: the optimizer's amp_step unscales them
    float clip_coef = 1.0f;  // folded into the scale amp_step divides by (clip_grad_norm_)
  };

  // Each optimizer's gradient list, kept between steps (src/scaler/grad_cache.h).
  // Only an accelerator: a copy of the scaler starts with none.
  class GradCaches {
   public:
    struct Map;
    GradCaches();
    ~GradCaches();
    GradCaches(const GradCaches& /*other*/);
    GradCaches& operator=(const GradCaches& other);
    GradCaches(GradCaches&& other) noexcept;
    GradCaches& operator=(GradCaches&& other) noexcept;
    Map& map();

   private:
    std::unique_ptr<Map> map_;
  };

  // Validates, then unscales (or, with `unscale` false, only checks, and with
  // `sum_squares` also sums the squares of every element); returns whether
  // any gradient was checked. Nothing is changed if it throws.
  bool unscale_grads_(torch::optim::Optimizer& optimizer, OptimizerState& state, bool unscale,
                      double* sum_squares = nullptr);
  // The stage checks of unscale_ and clip_grad_norm_.
  void check_ready_for_unscale_(const torch::optim::Optimizer& optimizer) const;
  // Records the agreed flag and the non-finite gradients of one check.
  void record_(const torch::optim::Optimizer& optimizer, OptimizerState& state,
               std::optional<bool> agreed, std::vector<NonFiniteGradient> report);
  NonFiniteGradient named_(size_t group, size_t index, const at::Tensor& param) const;
  std::string describe_non_finite(const torch::optim::Optimizer& optimizer) const;

  // The state: the schedule (scale, factors, intervals, trackers, dynamic,
  // min_scale) and the rest; options() is derived from these.
  ScaleSchedule schedule_;
  double init_scale_;
  bool enabled_;
  int64_t max_consecutive_skips_;
  int64_t consecutive_skips_ = 0;

  bool unscale_float16_;  // the option of that name

  FoundInfReducer found_inf_reducer_;
  std::unordered_map<const void*, std::string> parameter_names_;  // by TensorImpl
  std::unordered_map<const torch::optim::Optimizer*, std::vector<NonFiniteGradient>>
      last_non_finite_;
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
  GradCaches grad_caches_;
};

/// `torch::save(scaler, path)`: writes `state_dict()`'s entries into the
/// archive, as LibTorch's optimizers do (include <torch/serialize.h> for
/// torch::save/torch::load).
torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler);

/// `torch::load(scaler, path)`: reads the entries back and calls
/// `load_state_dict` (any schema, so a Paddle facade's file loads too), with
/// its errors.
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler);

}  // namespace torchamp
