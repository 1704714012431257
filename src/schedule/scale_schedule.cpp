#include <torchamp/scale_schedule.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace torchamp {

ScaleSchedule::ScaleSchedule(double init_scale, double growth_factor, double backoff_factor,
                             int64_t growth_interval, int64_t backoff_interval, bool dynamic,
                             double min_scale)
    : scale_(check_scale(init_scale, "init_scale")),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval),
      backoff_interval_(backoff_interval),
      dynamic_(dynamic),
      min_scale_(min_scale) {
  check_growth_factor(growth_factor, "growth_factor");
  check_backoff_factor(backoff_factor, "backoff_factor");
  check_interval(growth_interval, "growth_interval");
  check_interval(backoff_interval, "backoff_interval");
  check_min_scale(min_scale, "min_scale");
}

ScaleSchedule::State ScaleSchedule::advance(State state, bool found_inf, double growth_factor,
                                            double backoff_factor, int64_t growth_interval,
                                            int64_t backoff_interval, double min_scale) {
  if (found_inf) {
    state.growth_tracker = 0;
    if (++state.backoff_tracker >= backoff_interval) {
      // double arithmetic, one rounding to float32: as _amp_update_scale_.
      const auto backed_off = static_cast<float>(static_cast<double>(state.scale) * backoff_factor);
      // The floor never raises the scale: one already below it stays.
      state.scale = static_cast<double>(backed_off) >= min_scale
                        ? backed_off
                        : std::min(state.scale, static_cast<float>(min_scale));
      state.backoff_tracker = 0;
    }
  } else {
    state.backoff_tracker = 0;
    if (++state.growth_tracker >= growth_interval) {
      const auto grown = static_cast<float>(static_cast<double>(state.scale) * growth_factor);
      if (std::isfinite(grown)) {  // never grow past float32's range to inf
        state.scale = grown;
      }
      state.growth_tracker = 0;
    }
  }
  return state;
}

void ScaleSchedule::update(bool found_inf) {
  if (!dynamic_) {
    return;
  }
  const State next = advance({scale_, growth_tracker_, backoff_tracker_}, found_inf, growth_factor_,
                             backoff_factor_, growth_interval_, backoff_interval_, min_scale_);
  scale_ = next.scale;
  growth_tracker_ = next.growth_tracker;
  backoff_tracker_ = next.backoff_tracker;
}

void ScaleSchedule::set_scale(double scale) {
  scale_ = check_scale(scale, "scale");
}

void ScaleSchedule::set_growth_factor(double growth_factor) {
  check_growth_factor(growth_factor, "growth_factor");
  growth_factor_ = growth_factor;
}

void ScaleSchedule::set_backoff_factor(double backoff_factor) {
  check_backoff_factor(backoff_factor, "backoff_factor");
  backoff_factor_ = backoff_factor;
}

void ScaleSchedule::set_growth_interval(int64_t growth_interval) {
  check_interval(growth_interval, "growth_interval");
  growth_interval_ = growth_interval;
}

void ScaleSchedule::set_backoff_interval(int64_t backoff_interval) {
  check_interval(backoff_interval, "backoff_interval");
  backoff_interval_ = backoff_interval;
}

void ScaleSchedule::set_min_scale(double min_scale) {
  check_min_scale(min_scale, "min_scale");
  min_scale_ = min_scale;
}

void ScaleSchedule::set_growth_tracker(int64_t growth_tracker) {
  check_tracker(growth_tracker, "growth_tracker");
  growth_tracker_ = growth_tracker;
}

void ScaleSchedule::set_backoff_tracker(int64_t backoff_tracker) {
  check_tracker(backoff_tracker, "backoff_tracker");
  backoff_tracker_ = backoff_tracker;
}

float ScaleSchedule::check_scale(double value, const char* name) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 0.0, name, " must be a finite number > 0, got ",
                    value);
  const auto rounded = static_cast<float>(value);
  TORCH_CHECK_VALUE(std::isfinite(rounded) && rounded > 0.0f, name, " must be representable as a ",
                    "finite float32 > 0 (", std::numeric_limits<float>::denorm_min(), " to ",
                    std::numeric_limits<float>::max(), "), got ", value);
  return rounded;
}

void ScaleSchedule::check_growth_factor(double value, const char* name) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 1.0, name,
                    " must be a finite number > 1.0, got ", value);
}

void ScaleSchedule::check_backoff_factor(double value, const char* name) {
  TORCH_CHECK_VALUE(value > 0.0 && value < 1.0, name, " must be in (0, 1), got ", value);
}

void ScaleSchedule::check_interval(int64_t value, const char* name) {
  TORCH_CHECK_VALUE(value >= 1, name, " must be >= 1, got ", value);
}

void ScaleSchedule::check_tracker(int64_t value, const char* name) {
  TORCH_CHECK_VALUE(value >= 0, name, " must be >= 0, got ", value);
}

}  // namespace torchamp

namespace torchamp {

void ScaleSchedule::check_min_scale(double value, const char* name) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value >= 0.0, name,
                    " must be a finite number >= 0 (0: no floor), got ", value);
}

}  // namespace torchamp
