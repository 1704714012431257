// GradScaler::state_dict / load_state_dict: PyTorch's schema plus our keys.

#include <torchamp/grad_scaler.h>

#include "state_dict_util.h"

namespace torchamp {

StateDict GradScaler::state_dict() const {
  StateDict state(c10::StringType::get(), c10::AnyType::get());
  if (!is_enabled()) {
    return state;
  }
  // PyTorch's five keys, with Python's types (float, float, float, int, int).
  state.insert("scale", static_cast<double>(schedule_.scale()));
  state.insert("growth_factor", schedule_.growth_factor());
  state.insert("backoff_factor", schedule_.backoff_factor());
  state.insert("growth_interval", schedule_.growth_interval());
  state.insert("_growth_tracker", schedule_.growth_tracker());
  // Ours: Python's GradScaler ignores keys it does not know.
  state.insert("backoff_interval", schedule_.backoff_interval());
  state.insert("_backoff_tracker", schedule_.backoff_tracker());
  state.insert("dynamic", schedule_.dynamic());
  return state;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!is_enabled()) {
    return;
  }
  TORCH_CHECK(!state.empty(),
              "The source state dict is empty, possibly because it was saved from a disabled "
              "instance of GradScaler.");
  using detail::read_bool;
  using detail::read_double;
  using detail::read_int;

  // Read and validate everything into a copy; commit only if all is well.
  ScaleSchedule next = schedule_;
  const double scale = *read_double(state, "scale", true);
  next.set_scale(ScaleSchedule::check_scale(scale, "state_dict['scale']"));
  const double growth_factor = *read_double(state, "growth_factor", true);
  ScaleSchedule::check_growth_factor(growth_factor, "state_dict['growth_factor']");
  next.set_growth_factor(growth_factor);
  const double backoff_factor = *read_double(state, "backoff_factor", true);
  ScaleSchedule::check_backoff_factor(backoff_factor, "state_dict['backoff_factor']");
  next.set_backoff_factor(backoff_factor);
  const int64_t growth_interval = *read_int(state, "growth_interval", true);
  ScaleSchedule::check_interval(growth_interval, "state_dict['growth_interval']");
  next.set_growth_interval(growth_interval);
  const int64_t growth_tracker = *read_int(state, "_growth_tracker", true);
  ScaleSchedule::check_tracker(growth_tracker, "state_dict['_growth_tracker']");
  next.set_growth_tracker(growth_tracker);
  if (auto v = read_int(state, "backoff_interval", false)) {
    ScaleSchedule::check_interval(*v, "state_dict['backoff_interval']");
    next.set_backoff_interval(*v);
  }
  if (auto v = read_int(state, "_backoff_tracker", false)) {
    ScaleSchedule::check_tracker(*v, "state_dict['_backoff_tracker']");
    next.set_backoff_tracker(*v);
  }
  if (auto v = read_bool(state, "dynamic", false)) {
    next.set_dynamic(*v);
  }

  schedule_ = next;
  // Python sets _init_scale to the loaded scale; options() follows.
  options_.init_scale(scale)
      .growth_factor(next.growth_factor())
      .backoff_factor(next.backoff_factor())
      .growth_interval(next.growth_interval())
      .backoff_interval(next.backoff_interval())
      .dynamic(next.dynamic());
}

}  // namespace torchamp
