#include <torchamp/paddle.h>

#include "scaler/serialize.h"
#include "scaler/state_keys.h"

#include <c10/util/Exception.h>

namespace torchamp {
namespace paddle {
namespace {

// Paddle's arguments validated under Paddle's names, then mapped.
GradScalerOptions paddle_options(bool enable, double init_loss_scaling, double incr_ratio,
                                 double decr_ratio, int64_t incr_every_n_steps,
                                 int64_t decr_every_n_nan_or_inf, bool use_dynamic_loss_scaling,
                                 bool device_state) {
  ScaleSchedule::check_scale(init_loss_scaling, "init_loss_scaling");
  ScaleSchedule::check_growth_factor(incr_ratio, "incr_ratio");
  ScaleSchedule::check_backoff_factor(decr_ratio, "decr_ratio");
  ScaleSchedule::check_interval(incr_every_n_steps, "incr_every_n_steps");
  ScaleSchedule::check_interval(decr_every_n_nan_or_inf, "decr_every_n_nan_or_inf");
  return GradScalerOptions()
      .enabled(enable)
      .init_scale(enable ? init_loss_scaling : 1.0)  // Paddle: 1.0 when disabled
      .growth_factor(incr_ratio)
      .backoff_factor(decr_ratio)
      .growth_interval(incr_every_n_steps)
      .backoff_interval(decr_every_n_nan_or_inf)
      .dynamic(use_dynamic_loss_scaling)
      // Paddle's _unscale takes float16 gradients (of float16 parameters,
      // O2): multiplied in float32 by the float32 inverse scale and rounded
      // once, as its check_finite_and_unscale kernel.
      .unscale_float16(true)
      .device_state(device_state);
}

}  // namespace

GradScaler::GradScaler(bool enable, double init_loss_scaling, double incr_ratio, double decr_ratio,
                       int64_t incr_every_n_steps, int64_t decr_every_n_nan_or_inf,
                       bool use_dynamic_loss_scaling, bool device_state)
    : core_(paddle_options(enable, init_loss_scaling, incr_ratio, decr_ratio, incr_every_n_steps,
                           decr_every_n_nan_or_inf, use_dynamic_loss_scaling, device_state)) {}

StepResult GradScaler::minimize(torch::optim::Optimizer& optimizer) {
  StepResult result = core_.step(optimizer);
  core_.update();
  return result;
}

StepResult GradScaler::minimize(torch::optim::Optimizer& optimizer,
                                const at::Tensor& /*scaled_loss*/) {
  return minimize(optimizer);
}

void GradScaler::set_init_loss_scaling(double new_init_loss_scaling) {
  ScaleSchedule::check_scale(new_init_loss_scaling, "init_loss_scaling");
  core_.set_init_scale(new_init_loss_scaling);
}

void GradScaler::set_incr_ratio(double new_incr_ratio) {
  ScaleSchedule::check_growth_factor(new_incr_ratio, "incr_ratio");
  core_.set_growth_factor(new_incr_ratio);
}

void GradScaler::set_decr_ratio(double new_decr_ratio) {
  ScaleSchedule::check_backoff_factor(new_decr_ratio, "decr_ratio");
  core_.set_backoff_factor(new_decr_ratio);
}

void GradScaler::set_incr_every_n_steps(int64_t new_incr_every_n_steps) {
  ScaleSchedule::check_interval(new_incr_every_n_steps, "incr_every_n_steps");
  core_.set_growth_interval(new_incr_every_n_steps);
}

void GradScaler::set_decr_every_n_nan_or_inf(int64_t new_decr_every_n_nan_or_inf) {
  ScaleSchedule::check_interval(new_decr_every_n_nan_or_inf, "decr_every_n_nan_or_inf");
  core_.set_backoff_interval(new_decr_every_n_nan_or_inf);
}

StateDict GradScaler::state_dict() const {
  if (!is_enable()) {
    return StateDict(c10::StringType::get(), c10::AnyType::get());
  }
  return detail::write_state_dict(detail::state_of(core_), detail::Schema::kPaddle);
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!is_enable()) {
    return;
  }
  TORCH_CHECK(!state.empty(),
              "The input state dict is empty, possibly because it was saved from a disabled "
              "instance of GradScaler.");
  core_.load_state_dict(state);  // any schema; all-or-nothing; init scale = the loaded scale
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  return detail::save_scaler(archive, scaler);
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  return detail::load_scaler(archive, scaler);
}

}  // namespace paddle
}  // namespace torchamp
