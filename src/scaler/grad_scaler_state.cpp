// GradScaler::state_dict / load_state_dict through the one key table
// (state_keys.h): the core schema is written; every schema loads.

#include <torchamp/grad_scaler.h>

#include "scaler/state_keys.h"

#include <c10/util/Exception.h>

namespace torchamp {

StateDict GradScaler::state_dict() const {
  if (!is_enabled()) {
    return StateDict(c10::StringType::get(), c10::AnyType::get());
  }
  return detail::write_state_dict(detail::state_of(*this), detail::Schema::kCore);
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!is_enabled()) {
    return;
  }
  TORCH_CHECK(!state.empty(),
              "The source state dict is empty, possibly because it was saved from a disabled "
              "instance of GradScaler.");
  // Everything is read and validated first (read_state_dict throws before
  // anything changes); then committed at once, and nothing below can throw.
  const detail::ScalerState s = detail::read_state_dict(state, detail::state_of(*this));
  ScaleSchedule schedule(s.scale, s.growth_factor, s.backoff_factor, s.growth_interval,
                         s.backoff_interval, s.dynamic, s.min_scale);
  schedule.set_growth_tracker(s.growth_tracker);
  schedule.set_backoff_tracker(s.backoff_tracker);
  schedule_ = schedule;
  init_scale_ = s.scale;  // Python: _init_scale = state_dict["scale"]
  max_consecutive_skips_ = s.max_consecutive_skips;
  consecutive_skips_ = s.consecutive_skips;
  write_device_();
}

}  // namespace torchamp
