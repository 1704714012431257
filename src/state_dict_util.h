#pragma once

// Reading scaler state dicts of either schema (not installed).
//
// PyTorch's schema (the core GradScaler's): scale, growth_factor,
// backoff_factor, growth_interval, _growth_tracker [+ backoff_interval,
// _backoff_tracker, dynamic]. Paddle's: scale (1-element tensor), incr_ratio,
// decr_ratio, incr_every_n_steps, decr_every_n_nan_or_inf, incr_count,
// decr_count, use_dynamic_loss_scaling. The keys say which one a dict is; both
// facades read both through parse_state_dict.

#include <torchamp/grad_scaler.h>
#include <torchamp/scale_schedule.h>

#include <optional>

namespace torchamp {
namespace detail {

enum class Schema { kPyTorch, kPaddle };

/// The schedule's fields read from a dict; absent optional keys stay nullopt.
struct ParsedState {
  Schema schema;
  double scale;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int64_t growth_tracker;
  std::optional<int64_t> backoff_interval;
  std::optional<int64_t> backoff_tracker;
  std::optional<bool> dynamic;
  std::optional<double> min_scale;               // core schema only
  std::optional<int64_t> max_consecutive_skips;  // core schema only
  std::optional<int64_t> consecutive_skips;      // core schema only
};

/// Detects the schema, checks every key's presence, type and value, and throws
/// c10::ValueError naming the key ("state_dict['incr_ratio'] must be ...") on
/// the first problem; a dict mixing both schemas' keys is refused. Unknown
/// keys are ignored. Does not handle the empty dict (each facade has its own
/// message for it).
ParsedState parse_state_dict(const StateDict& state);

/// `schedule` with the parsed fields applied; absent optional fields keep
/// `schedule`'s values. Cannot throw: parse_state_dict validated everything.
ScaleSchedule apply_state(ScaleSchedule schedule, const ParsedState& parsed);

}  // namespace detail
}  // namespace torchamp
