#pragma once

// Shared test helpers: typed-exception checks and scaler snapshots.

#include <torchamp/grad_scaler.h>

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace torchamp_test {

/// The parameter a master weight rounds to (the masters' rule, on the host):
/// float16 to nearest even; bfloat16 to nearest, ties away from zero (the
/// remainder scheme), where `to(kBFloat16)` would take the even one. On the
/// CPU, wherever the master is.
inline at::Tensor master_rounded(const at::Tensor& master, at::ScalarType dtype) {
  if (dtype == at::kHalf) {
    return master.to(at::kHalf).cpu();
  }
  const at::Tensor m = master.to(at::kFloat).cpu().contiguous();
  at::Tensor out = at::empty(m.sizes(), at::kBFloat16);
  const auto* in = static_cast<const uint32_t*>(m.data_ptr());
  auto* o = static_cast<uint16_t*>(out.data_ptr());
  for (int64_t i = 0; i < m.numel(); ++i) {
    o[i] = static_cast<uint16_t>((in[i] >> 16) + ((in[i] & 0xffffu) >= 0x8000u ? 1u : 0u));
  }
  return out;
}

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

/// Counts, while it lives, the ATen operators this thread calls at the top
/// (not those they call), as kernel launches on a GPU would be counted.
/// With `kernels_only`, not those that only make a view of a tensor (no
/// kernel on any device; a reshape counts as one, as it is of a contiguous
/// tensor).
class TopLevelOps {
 public:
  explicit TopLevelOps(bool kernels_only = false) {
    count_ = 0;
    kernels_only_ = kernels_only;
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              count_ += depth_++ == 0 && !(kernels_only_ && is_view(fn.name())) ? 1 : 0;
              return nullptr;
            },
            [](const at::RecordFunction& /*fn*/, at::ObserverContext* /*context*/) { --depth_; })
            .scopes({at::RecordScope::FUNCTION}));
  }
  ~TopLevelOps() { at::removeCallback(handle_); }
  TopLevelOps(const TopLevelOps&) = delete;
  TopLevelOps& operator=(const TopLevelOps&) = delete;
  int count() const { return count_; }

 private:
  static bool is_view(const char* name) {
    for (const char* view : {"aten::view", "aten::reshape", "aten::_reshape_alias",
                             "aten::split_with_sizes", "aten::narrow", "aten::slice",
                             "aten::select", "aten::as_strided", "aten::alias", "aten::detach"}) {
      if (std::strcmp(name, view) == 0) {
        return true;
      }
    }
    return false;
  }
  static inline thread_local int count_ = 0, depth_ = 0;
  static inline thread_local bool kernels_only_ = false;
  at::CallbackHandle handle_;
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
