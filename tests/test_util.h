#pragma once

// Shared test helpers: typed-exception checks and scaler snapshots.

#include <torchamp/grad_scaler.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>

namespace torchamp_test {

/// Runs f; expects exactly exception type E (not a subclass-free check: E or
/// derived) whose message contains `needle`.
template <class E, class F>
void expect_throws(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing: " << needle;
  } catch (const E& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type; message: " << e.what();
  }
}

/// ATen's intra-op thread count for a scope, put back after it. scripts/test
/// runs the tests with OMP_NUM_THREADS=1 (two test processes at once on two
/// cores: two threads each spun against each other), so a test about work
/// split across threads names its count.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : was_(at::get_num_threads()) {
    at::set_num_threads(threads);
  }
  ~ScopedThreads() { at::set_num_threads(was_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int was_;
};

/// Everything observable about a scaler's schedule.
struct Snapshot {
  double scale, growth_factor, backoff_factor;
  int64_t growth_interval, backoff_interval, growth_tracker, backoff_tracker;
  bool dynamic, enabled;

  explicit Snapshot(const torchamp::GradScaler& s)
      : scale(s.get_scale()),
        growth_factor(s.get_growth_factor()),
        backoff_factor(s.get_backoff_factor()),
        growth_interval(s.get_growth_interval()),
        backoff_interval(s.get_backoff_interval()),
        growth_tracker(s.get_growth_tracker()),
        backoff_tracker(s.get_backoff_tracker()),
        dynamic(s.is_dynamic()),
        enabled(s.is_enabled()) {}

  bool operator==(const Snapshot& o) const {
    return scale == o.scale && growth_factor == o.growth_factor &&
           backoff_factor == o.backoff_factor && growth_interval == o.growth_interval &&
           backoff_interval == o.backoff_interval && growth_tracker == o.growth_tracker &&
           backoff_tracker == o.backoff_tracker && dynamic == o.dynamic && enabled == o.enabled;
  }
};

inline std::ostream& operator<<(std::ostream& os, const Snapshot& s) {
  return os << "{scale " << s.scale << ", growth_factor " << s.growth_factor << ", backoff_factor "
            << s.backoff_factor << ", growth_interval " << s.growth_interval
            << ", backoff_interval " << s.backoff_interval << ", growth_tracker "
            << s.growth_tracker << ", backoff_tracker " << s.backoff_tracker << ", dynamic "
            << s.dynamic << ", enabled " << s.enabled << "}";
}

}  // namespace torchamp_test
