#pragma once

/// \file
/// `torchamp::paddle::GradScaler`: PaddlePaddle's `paddle.amp.GradScaler` API
/// (names, defaults, getters/setters, `minimize`, Paddle's state_dict schema)
/// over torchamp's GradScaler. The arithmetic is the core's: Paddle's
/// hysteresis is the core schedule with `backoff_interval =
/// decr_every_n_nan_or_inf`.

#include <torchamp/grad_scaler.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace torchamp {
namespace paddle {

/// ```
/// torchamp::paddle::GradScaler scaler(/*enable=*/true, /*init_loss_scaling=*/1024);
/// auto scaled = scaler.scale(loss);
/// scaled.backward();
/// scaler.minimize(optimizer, scaled);  // step, then update the scale
/// optimizer.zero_grad();
/// ```
///
/// Stages, errors and the treatment of gradients are the core's (see
/// torchamp::GradScaler). Differences from Paddle: the current scale never
/// grows to a non-finite float32, `update()` with no gradient checked throws
/// as in PyTorch, and overflow is tracked per optimizer (Paddle keeps one flag
/// for the last optimizer unscaled).
class GradScaler {
 public:
  /// Paddle's names and the specification's defaults (Paddle 2.x's
  /// `paddle.amp.GradScaler`: 32768, 1000 steps, 2 overflows; Paddle 2.6 and
  /// later default to 65536, 2000 and 1). Throws `c10::ValueError` naming the
  /// argument for: init_loss_scaling not finite > 0 (as float32); incr_ratio
  /// not > 1; decr_ratio not in (0, 1); incr_every_n_steps or
  /// decr_every_n_nan_or_inf < 1 (also when disabled, where Paddle checks
  /// nothing). `device_state` is torchamp's, as
  /// `GradScalerOptions::device_state`: the state in tensors also on the CPU
  /// (for tests and parity; CUDA gradients put it on their device anyway).
  explicit GradScaler(bool enable = true, double init_loss_scaling = 32768.0,
                      double incr_ratio = 2.0, double decr_ratio = 0.5,
                      int64_t incr_every_n_steps = 1000, int64_t decr_every_n_nan_or_inf = 2,
                      bool use_dynamic_loss_scaling = true, bool device_state = false);

  /// `var * scale` (dtype and device kept); disabled: `var` itself.
  at::Tensor scale(const at::Tensor& var) { return core_.scale(var); }
  /// As torchamp::GradScaler::unscale_, but float16 gradients are unscaled
  /// too, as Paddle's `_unscale` does (float32 multiply, rounded once).
  void unscale_(torch::optim::Optimizer& optimizer) { core_.unscale_(optimizer); }
  /// As torchamp::GradScaler::step: without a value when skipped (a
  /// `StepResult`, which converts to `std::optional<at::Tensor>`; with the
  /// state on a device it reads the flag back only when asked).
  StepResult step(torch::optim::Optimizer& optimizer) { return core_.step(optimizer); }
  /// Updates the scale (Paddle's hysteresis) and returns every optimizer to
  /// ready. Throws `c10::Error` if no gradient was checked since the last
  /// update. Disabled: does nothing.
  void update() { core_.update(); }
  /// `step(optimizer)` then `update()`; returns what step returned. Paddle's
  /// `minimize(optimizer, scaled_loss)` form is accepted too; the loss is not
  /// needed (the gradients already hold it).
  StepResult minimize(torch::optim::Optimizer& optimizer);
  StepResult minimize(torch::optim::Optimizer& optimizer, const at::Tensor& scaled_loss);

  bool is_enable() const { return core_.is_enabled(); }
  /// false when disabled, as Paddle.
  bool is_use_dynamic_loss_scaling() const { return is_enable() && core_.is_dynamic(); }

  /// The configured initial scale (not the current one); when disabled 1.0
  /// (as Paddle: `_init_loss_scaling = 1.0`) until `set_init_loss_scaling`.
  double get_init_loss_scaling() const { return core_.options().init_scale(); }
  /// Sets the initial scale and resets the current scale to it.
  void set_init_loss_scaling(double new_init_loss_scaling);
  double get_incr_ratio() const { return core_.get_growth_factor(); }
  void set_incr_ratio(double new_incr_ratio);
  double get_decr_ratio() const { return core_.get_backoff_factor(); }
  void set_decr_ratio(double new_decr_ratio);
  int64_t get_incr_every_n_steps() const { return core_.get_growth_interval(); }
  void set_incr_every_n_steps(int64_t new_incr_every_n_steps);
  int64_t get_decr_every_n_nan_or_inf() const { return core_.get_backoff_interval(); }
  void set_decr_every_n_nan_or_inf(int64_t new_decr_every_n_nan_or_inf);

  /// The ratio and interval getters above return the configured values also
  /// when disabled (Paddle raises AttributeError there: a disabled scaler
  /// never sets them).
  ///
  /// The current scale; when disabled 1.0, as PyTorch's `get_scale()` (the
  /// specification's Paddle has no `get_scale`; Paddle's develop branch,
  /// 2026, returns 0.0 when disabled). Paddle keeps it in `_scale`.
  double get_scale() const { return core_.get_scale(); }
  /// Consecutive clean / overflowing updates counted so far.
  int64_t get_incr_count() const { return core_.get_growth_tracker(); }
  int64_t get_decr_count() const { return core_.get_backoff_tracker(); }

  /// Paddle's eight keys: `scale` (1-element float32 tensor), `incr_ratio`,
  /// `decr_ratio` (float), `incr_every_n_steps`, `decr_every_n_nan_or_inf`,
  /// `incr_count`, `decr_count` (int), `use_dynamic_loss_scaling` (bool).
  /// Empty when disabled.
  StateDict state_dict() const;

  /// Loads Paddle's schema, or any other the core reads (PyTorch's, whose
  /// missing keys keep their values; lucid's). Checks everything before changing anything:
  /// `c10::ValueError` naming a missing, mistyped or out-of-range key;
  /// `c10::Error` "The input state dict is empty, ..." for `{}`. Sets the
  /// initial scale to the loaded scale, as Paddle. Disabled: does nothing.
  void load_state_dict(const StateDict& state);

  /// As torchamp::GradScaler::set_found_inf_reducer (see torchamp/distributed.h).
  void set_found_inf_reducer(torchamp::GradScaler::FoundInfReducer reducer) {
    core_.set_found_inf_reducer(std::move(reducer));
  }

  /// The core scaler underneath.
  const torchamp::GradScaler& core() const { return core_; }

 private:
  torchamp::GradScaler core_;  // the whole state: the facade holds nothing else
};

/// `torch::save(scaler, path)` / `torch::load(scaler, path)`, as the core's.
torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler);
torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler);

}  // namespace paddle
}  // namespace torchamp
