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
#include <utility>
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
  /// true: the scale, its trackers and the found-inf flags live in tensors
  /// on the CPU and are updated there by ATen's AMP ops, as Python's
  /// `GradScaler("cpu")` and as they always do for CUDA tensors (no host
  /// read in an iteration: docs/grad_scaler.md#where-the-state-lives); a
  /// disabled scaler's `clip_grad_norm_tensor_` then clips CPU gradients in
  /// tensor ops too, as CUDA ones. For tests and parity; false (default): on
  /// the CPU they are host values.
  TORCH_ARG(bool, device_state) = false;
};

namespace detail {

/// The scaler's per-optimizer gradient lists, kept between steps; opaque
/// outside the library (src/scaler/grad_cache.h). A copy starts with none.
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

}  // namespace detail

/// What `GradScaler::step` returns: what `optimizer.step()` returned, or
/// nothing when the step was skipped, as a `std::optional<at::Tensor>` (to
/// which it converts). On a scaler whose state lives on a device, whether
/// the step was skipped is known there: asking (`has_value()`, `bool`,
/// `value()`, `*`, the conversion) reads it back then, once, not before.
class StepResult {
 public:
  StepResult() = default;  ///< skipped
  StepResult(std::nullopt_t /*none*/) {}
  StepResult(at::Tensor value) : value_(std::move(value)) {}
  /// Skipped where `found_inf` (a 0-dim float32 flag on a device) is not 0.
  static StepResult pending(at::Tensor value, at::Tensor found_inf);

  bool has_value() const;
  explicit operator bool() const { return has_value(); }
  /// Throws `std::bad_optional_access` when the step was skipped.
  const at::Tensor& value() const;
  const at::Tensor& operator*() const { return value(); }
  const at::Tensor* operator->() const { return &value(); }
  operator std::optional<at::Tensor>() const;

 private:
  std::optional<at::Tensor> value_;
  at::Tensor found_inf_;  // defined: not yet read back
  mutable std::optional<bool> skipped_;
};

/// A parameter whose gradient held an inf/NaN at the last `unscale_`.
struct NonFiniteGradient {
  size_t group;      ///< index into optimizer.param_groups()
  size_t index;      ///< index into that group's params()
  std::string name;  ///< as registered with register_parameter_names, else empty
};

/// Dynamic loss scaling, Python's `torch.amp.GradScaler`:
/// `scaler.scale(loss).backward(); scaler.unscale_(opt);` (optional)
/// `scaler.step(opt);` (skipped on inf/NaN) `scaler.update();`. Errors are
/// typed as Python's, and a call that throws changes nothing. Every call in
/// full, and how each differs from Python: docs/grad_scaler.md.
class GradScaler {
 public:
  using LossClosure = std::function<at::Tensor()>;

  /// Throws `c10::ValueError` naming the option and value if any option is
  /// out of range, also when `enabled` is false.
  explicit GradScaler(GradScalerOptions options = {});

  /// `output * scale`, as Python's (a 0-dim float32 scale, ATen's type
  /// promotion); disabled: `output`. `c10::ValueError` if undefined.
  at::Tensor scale(const at::Tensor& output);

  /// `scale` applied to each tensor, order kept. Every tensor is checked
  /// before any is scaled.
  std::vector<at::Tensor> scale(const std::vector<at::Tensor>& outputs);

  /// Python's `unscale_`: divides every gradient in place, recording inf/NaN.
  /// Throws, changing nothing: `c10::Error` if `unscale_` or `step` already
  /// ran since `update()`; `c10::ValueError` for a float16 gradient (unless
  /// `unscale_float16`); `c10::NotImplementedError` for other dtypes/layouts.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// Python's `step`: `optimizer.step()` on unscaled gradients, or nothing
  /// (a `StepResult` without a value) without it when one was inf/NaN. An optimizer with
  /// `StepSupportsAmpScaling` takes the scale in its update instead. The
  /// `max_consecutive_skips`-th skip in a row throws `c10::Error`, as does a
  /// second `step` before `update()` or an optimizer without gradients.
  StepResult step(torch::optim::Optimizer& optimizer);

  /// `unscale_(opt)` then `clip_grad_norm_(params, max_norm)` in one call;
  /// returns the real norm (inf/NaN on overflow). With `StepSupportsAmpScaling`
  /// the clip is folded into the scale `step` hands over. `c10::ValueError`
  /// for a negative or non-finite `max_norm`.
  double clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm);

  /// `clip_grad_norm_` returning the norm as a 0-dim float32 tensor, as
  /// Python's `clip_grad_norm_` does: on a device scaler the norm stays on
  /// the gradients' device (no read back, so the call can be captured in a
  /// CUDA graph); elsewhere a CPU tensor of the same value. Disabled, on
  /// gradients off the CPU or with `device_state`, and on a device scaler
  /// with an optimizer that takes no scale: Python's tensor-op clip, whose
  /// norm has the gradients' dtype (docs/grad_scaler.md).
  at::Tensor clip_grad_norm_tensor_(torch::optim::Optimizer& optimizer, double max_norm);

  /// Refused while enabled (`c10::Error`: its gradients would not be
  /// unscaled); disabled: `optimizer.step(closure)`.
  StepResult step(torch::optim::Optimizer& optimizer, LossClosure closure);

  /// Python's `update`: backs off after `backoff_interval` overflowing updates,
  /// grows after `growth_interval` clean ones; `new_scale` sets the scale.
  /// `c10::Error` when no gradient was checked since the last update.
  void update(std::optional<double> new_scale = std::nullopt);

  /// The current scale (a float32 value); 1.0 when disabled. This, the
  /// trackers' and skips' getters, `options()`, `state_dict()` and
  /// `non_finite_gradients()` read a device scaler's state back (one sync).
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
  int64_t get_growth_tracker() const { return host_().growth_tracker(); }
  /// Consecutive overflowing updates counted so far.
  int64_t get_backoff_tracker() const { return host_().backoff_tracker(); }
  bool is_dynamic() const { return schedule_.dynamic(); }

  double get_min_scale() const { return schedule_.min_scale(); }
  int64_t get_max_consecutive_skips() const { return max_consecutive_skips_; }
  /// Skipped steps since the last clean update.
  int64_t get_consecutive_skips() const {
    host_();
    return consecutive_skips_;
  }

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

  /// The parameters whose gradients held an inf/NaN at this optimizer's
  /// last `unscale_` (or `step`), in optimizer order. A device scaler finds
  /// them when asked, in the gradients as they are then (ask before
  /// `zero_grad`).
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

  /// How ranks agree on an overflow (torchamp/distributed.h makes one): called
  /// with this rank's flag before anything changes; if it throws, nothing has.
  using FoundInfReducer = std::function<bool(bool found_inf, c10::Device device)>;
  void set_found_inf_reducer(FoundInfReducer reducer) { found_inf_reducer_ = std::move(reducer); }
  bool has_found_inf_reducer() const { return static_cast<bool>(found_inf_reducer_); }

  /// PyTorch's five keys and torchamp's six (docs/checkpoints.md); empty when
  /// disabled. Python's `state_dict`.
  StateDict state_dict() const;

  /// Python's `load_state_dict`; also Paddle's and the reference page's
  /// schemas, told apart by their keys. All or nothing: `c10::ValueError`
  /// naming a bad key, `c10::Error` for an empty dict.
  void load_state_dict(const StateDict& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };

  struct OptimizerState {
    Stage stage = Stage::kReady;
    bool checked = false;    // at least one gradient was checked
    bool found_inf = false;  // agreed result (one host sync per device, at unscale)
    bool deferred = false;   // gradients left scaled: the optimizer's amp_step unscales them
    float clip_coef = 1.0f;  // folded into the scale amp_step divides by (clip_grad_norm_)
    // A device scaler's instead of found_inf and clip_coef: a float32 0-dim
    // flag per device of the gradients, and the clip coefficient (undefined: 1).
    std::vector<at::Tensor> found_on;
    at::Tensor clip_coef_on;
  };

  // The scale, the trackers and the consecutive-skip count of a scaler whose
  // state lives on a device (a CUDA scaler, or device_state): 0-dim tensors
  // there, updated in place. `schedule_` and `consecutive_skips_` then hold
  // what was last read back, and `host_()` reads them again whenever asked:
  // the device's are the state (a CUDA graph's replays advance them with no
  // host code running).
  struct OnDevice {
    OnDevice() = default;
    // A copied scaler gets its own tensors (not the same ones, updated in place).
    OnDevice(const OnDevice& other)
        : scale(other.scale.clone()),
          growth(other.growth.clone()),
          backoff(other.backoff.clone()),
          skips(other.skips.clone()),
          tracker_below_interval(other.tracker_below_interval) {}
    OnDevice& operator=(const OnDevice& other) {
      OnDevice copy(other);
      return *this = std::move(copy);
    }
    OnDevice(OnDevice&& other) noexcept = default;
    OnDevice& operator=(OnDevice&& other) noexcept = default;
    ~OnDevice() = default;
    at::Tensor scale;    // float32
    at::Tensor growth;   // int32, as _amp_update_scale_ takes it
    at::Tensor backoff;  // int32
    at::Tensor skips;    // int64
    // The growth tracker is below its interval (always after an update; a
    // setter or a load may break it): _amp_update_scale_'s rule then agrees.
    bool tracker_below_interval = true;
  };

  // Validates, then unscales (or, with `unscale` false, only checks, and with
  // `sum_squares` also sums the squares of every element); returns whether
  // any gradient was checked. Nothing is changed if it throws.
  bool unscale_grads_(torch::optim::Optimizer& optimizer, OptimizerState& state, bool unscale,
                      double* sum_squares = nullptr);
  // The same on a device scaler, with no host read (a reducer reads the
  // flags); `norm`: also the real gradients' norm (0-dim float32).
  bool unscale_on_device_(torch::optim::Optimizer& optimizer, OptimizerState& state, bool unscale,
                          at::Tensor* norm = nullptr);
  // Whether gradients on `device` take the device state (made on first use).
  bool on_device_(c10::Device device);
  // The schedule, read back first where a device holds the state.
  const ScaleSchedule& host_() const;
  // Writes the host values into the device state after a setter or a load.
  void write_device_();
  // One optimizer's agreed flag on the scale's device (the flags' sum).
  at::Tensor found_total_(const OptimizerState& state) const;
  void update_on_device_();
  // Refuses (c10::Error, before anything changes) what reads the flag back
  // at every step while a CUDA graph is being captured on the scale's device.
  void check_capturable_(const char* call, bool host_optimizer) const;
  // Both clip_grad_norm_s: the norm; on a device scaler (and, disabled, for
  // `tensor_form` with gradients off the CPU or device_state) NaN, and the
  // norm tensor in *on_device.
  double clip_(torch::optim::Optimizer& optimizer, double max_norm, at::Tensor* on_device,
               bool tensor_form);
  // The stage checks of unscale_ and clip_grad_norm_.
  void check_ready_for_unscale_(const torch::optim::Optimizer& optimizer) const;
  // Records the agreed flag and the non-finite gradients of one check.
  void record_(const torch::optim::Optimizer& optimizer, OptimizerState& state,
               std::optional<bool> agreed, std::vector<NonFiniteGradient> report);
  NonFiniteGradient named_(size_t group, size_t index, const at::Tensor& param) const;
  std::string describe_non_finite(const torch::optim::Optimizer& optimizer) const;

  // The state: the schedule (scale, factors, intervals, trackers, dynamic,
  // min_scale) and the rest; options() is derived from these.
  mutable ScaleSchedule schedule_;
  double init_scale_;
  bool enabled_;
  int64_t max_consecutive_skips_;
  mutable int64_t consecutive_skips_ = 0;

  bool unscale_float16_;  // the option of that name
  bool device_state_;     // the option of that name
  mutable std::optional<OnDevice> device_;

  FoundInfReducer found_inf_reducer_;
  std::unordered_map<const void*, std::string> parameter_names_;  // by TensorImpl
  std::unordered_map<const torch::optim::Optimizer*, std::vector<NonFiniteGradient>>
      last_non_finite_;
  // A device scaler's last checked parameters per optimizer, for the report.
  struct CheckedParam {
    size_t group;
    size_t index;
    at::Tensor param;
  };
  std::unordered_map<const torch::optim::Optimizer*, std::vector<CheckedParam>> last_checked_;
  std::unordered_map<const torch::optim::Optimizer*, OptimizerState> per_optimizer_;
  detail::GradCaches grad_caches_;
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
