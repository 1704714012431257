// GradScaler::state_dict / load_state_dict: PyTorch's schema plus our keys;
// Paddle's schema loads too (see state_dict_util.h for the mapping).

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
  state.insert("min_scale", schedule_.min_scale());
  state.insert("max_consecutive_skips", options_.max_consecutive_skips());
  state.insert("_consecutive_skips", consecutive_skips_);
  return state;
}

void GradScaler::load_state_dict(const StateDict& state) {
  if (!is_enabled()) {
    return;
  }
  TORCH_CHECK(!state.empty(),
              "The source state dict is empty, possibly because it was saved from a disabled "
              "instance of GradScaler.");
  // Everything is read and validated first; then committed at once.
  const detail::ParsedState parsed = detail::parse_state_dict(state);
  schedule_ = detail::apply_state(schedule_, parsed);
  // Python sets _init_scale to the loaded scale; options() follows.
  options_.init_scale(parsed.scale)
      .growth_factor(schedule_.growth_factor())
      .backoff_factor(schedule_.backoff_factor())
      .growth_interval(schedule_.growth_interval())
      .backoff_interval(schedule_.backoff_interval())
      .dynamic(schedule_.dynamic())
      .min_scale(schedule_.min_scale());
  if (parsed.max_consecutive_skips) {
    options_.max_consecutive_skips(*parsed.max_consecutive_skips);
  }
  if (parsed.consecutive_skips) {
    consecutive_skips_ = *parsed.consecutive_skips;
  }
}

}  // namespace torchamp
