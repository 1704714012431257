#include <torchamp/scale_schedule.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace torchamp {

ScaleSchedule::ScaleSchedule(double init_scale, double growth_factor, double backoff_factor,
                             int64_t growth_interval, int64_t backoff_interval, bool dynamic)
    : scale_(check_scale(init_scale, "init_scale")),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval),
      backoff_interval_(backoff_interval),
      dynamic_(dynamic) {
  check_growth_factor(growth_factor, "growth_factor");
  check_backoff_factor(backoff_factor, "backoff_factor");
  check_interval(growth_interval, "growth_interval");
  check_interval(backoff_interval, "backoff_interval");
}

void ScaleSchedule::update(bool found_inf) {
  if (!dynamic_) {
    return;
  }
  if (found_inf) {
    growth_tracker_ = 0;
    if (++backoff_tracker_ >= backoff_interval_) {
      // double arithmetic, one rounding to float32: as _amp_update_scale_.
      scale_ = static_cast<float>(static_cast<double>(scale_) * backoff_factor_);
      backoff_tracker_ = 0;
    }
  } else {
    backoff_tracker_ = 0;
    if (++growth_tracker_ >= growth_interval_) {
      const auto grown = static_cast<float>(static_cast<double>(scale_) * growth_factor_);
      if (std::isfinite(grown)) {  // never grow past float32's range to inf
        scale_ = grown;
      }
      growth_tracker_ = 0;
    }
  }
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
