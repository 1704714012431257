#pragma once

/// \file
/// The dynamic loss-scale schedule: pure arithmetic, no tensors.
///
/// One class serves both facades. PyTorch's rule is the special case
/// `backoff_interval = 1`; Paddle's rule is `backoff_interval =
/// decr_every_n_nan_or_inf`.

#include <cstdint>

namespace torchamp {

/// The loss scale and its growth/backoff trackers.
///
/// The scale is a float32 value, as in PyTorch (`_scale` is a float32 tensor)
/// and Paddle. Growth and backoff are computed in double and rounded to float32
/// once, as ATen's `_amp_update_scale_` does.
///
/// Every setter validates its argument first and throws `c10::ValueError`
/// naming the value; a throwing call changes nothing.
class ScaleSchedule {
 public:
  /// Throws `c10::ValueError` if any argument is out of range (see the
  /// `check_*` helpers below).
  ScaleSchedule(double init_scale, double growth_factor, double backoff_factor,
                int64_t growth_interval, int64_t backoff_interval, bool dynamic,
                double min_scale = 0.0);

  /// Records one update. `found_inf`: whether any checked gradient since the
  /// last update held an inf/NaN.
  ///
  /// - overflow: the clean counter resets; after `backoff_interval`
  ///   consecutive overflowing updates the scale is multiplied by
  ///   `backoff_factor`, but not below `min_scale` (a scale already below it
  ///   stays), and the overflow counter resets;
  /// - clean: the overflow counter resets; after `growth_interval` consecutive
  ///   clean updates the scale is multiplied by `growth_factor` unless the
  ///   result is not a finite float32 (then the scale stays), and the clean
  ///   counter resets either way.
  ///
  /// A counter already at or past its interval (an interval lowered by a
  /// setter) triggers at the next update of its kind. With `dynamic() ==
  /// false` this does nothing at all.
  void update(bool found_inf);

  /// One update as a pure function of the state, without validation: what
  /// `update` applies, and what ATen's `_amp_update_scale_` computes
  /// (`backoff_interval = 1`). Returns the new scale and trackers.
  struct State {
    float scale;
    int64_t growth_tracker;
    int64_t backoff_tracker;
  };
  static State advance(State state, bool found_inf, double growth_factor, double backoff_factor,
                       int64_t growth_interval, int64_t backoff_interval, double min_scale = 0.0);

  float scale() const noexcept { return scale_; }
  double growth_factor() const noexcept { return growth_factor_; }
  double backoff_factor() const noexcept { return backoff_factor_; }
  int64_t growth_interval() const noexcept { return growth_interval_; }
  int64_t backoff_interval() const noexcept { return backoff_interval_; }
  int64_t growth_tracker() const noexcept { return growth_tracker_; }
  int64_t backoff_tracker() const noexcept { return backoff_tracker_; }
  bool dynamic() const noexcept { return dynamic_; }
  /// The floor of backoffs; 0: none (PyTorch's behaviour).
  double min_scale() const noexcept { return min_scale_; }

  /// Sets the scale and both trackers as `advance` left them, unvalidated:
  /// for a state kept elsewhere (a GradScaler's on a device) and read back.
  void restore(const State& state) noexcept {
    scale_ = state.scale;
    growth_tracker_ = state.growth_tracker;
    backoff_tracker_ = state.backoff_tracker;
  }

  /// Sets the scale (rounded to float32); counters untouched.
  void set_scale(double scale);
  void set_growth_factor(double growth_factor);
  void set_backoff_factor(double backoff_factor);
  void set_growth_interval(int64_t growth_interval);
  void set_backoff_interval(int64_t backoff_interval);
  void set_growth_tracker(int64_t growth_tracker);
  void set_backoff_tracker(int64_t backoff_tracker);
  void set_dynamic(bool dynamic) noexcept { dynamic_ = dynamic; }
  void set_min_scale(double min_scale);

  // Validators shared by both facades. `name` is the option's name in the
  // caller's vocabulary ("growth_factor" or "incr_ratio"); each throws
  // c10::ValueError "<name> must be ..., got <value>".

  /// Finite, > 0, and still finite and > 0 once rounded to float32. Returns
  /// the float32 value.
  static float check_scale(double value, const char* name);
  /// Finite and > 1.
  static void check_growth_factor(double value, const char* name);
  /// In (0, 1).
  static void check_backoff_factor(double value, const char* name);
  /// >= 1.
  static void check_interval(int64_t value, const char* name);
  /// >= 0.
  static void check_tracker(int64_t value, const char* name);
  /// Finite and >= 0 (0: no floor).
  static void check_min_scale(double value, const char* name);

 private:
  float scale_;
  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  int64_t backoff_interval_;
  int64_t growth_tracker_ = 0;
  int64_t backoff_tracker_ = 0;
  bool dynamic_;
  double min_scale_;
};

}  // namespace torchamp
