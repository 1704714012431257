// ScaleSchedule: the pure arithmetic of the loss scale, alone.
#include <torchamp/scale_schedule.h>

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

using torchamp::ScaleSchedule;

ScaleSchedule make(double init, int64_t growth_interval, int64_t backoff_interval = 1,
                   bool dynamic = true) {
  return ScaleSchedule(init, 2.0, 0.5, growth_interval, backoff_interval, dynamic);
}

// Applies updates ('i' = overflow, 'c' = clean); returns the scale after each.
std::vector<double> run(ScaleSchedule& s, const std::string& updates) {
  std::vector<double> out;
  for (char u : updates) {
    s.update(u == 'i');
    out.push_back(s.scale());
  }
  return out;
}

TEST(ScaleSchedule, PyTorchRuleGrowsAfterIntervalAndHalvesOnEveryOverflow) {
  // PyTorch (backoff_interval 1): growth every growth_interval clean updates.
  auto s = make(1024, 3);
  EXPECT_EQ(run(s, "ccc"), (std::vector<double>{1024, 1024, 2048}));
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(run(s, "cci"), (std::vector<double>{2048, 2048, 1024}));
  EXPECT_EQ(s.growth_tracker(), 0);  // an overflow resets the clean count
  EXPECT_EQ(run(s, "ii"), (std::vector<double>{512, 256}));
}

TEST(ScaleSchedule, PaddleHysteresisExampleFromTheIssue) {
  // n = 2, init 1024, N large: [inf, clean, inf, inf] -> 1024, 1024, 1024, 512.
  auto s = make(1024, 1000, 2);
  EXPECT_EQ(run(s, "icii"), (std::vector<double>{1024, 1024, 1024, 512}));
  EXPECT_EQ(s.backoff_tracker(), 0);
}

TEST(ScaleSchedule, HysteresisTable) {
  struct Case {
    int64_t growth_interval, backoff_interval;
    const char* updates;
    std::vector<double> scales;
  };
  const std::vector<Case> cases = {
      {1, 1, "cciic", {2048, 4096, 2048, 1024, 2048}},
      {2, 2, "iiii", {1024, 512, 512, 256}},
      {2, 3, "iicii", {1024, 1024, 1024, 1024, 1024}},
      {2, 3, "iiiciii", {1024, 1024, 512, 512, 512, 512, 256}},
      {3, 2, "ccicc", {1024, 1024, 1024, 1024, 1024}},
      {3, 2, "ccicccc", {1024, 1024, 1024, 1024, 1024, 2048, 2048}},
      {1, 2, "icicic", {1024, 2048, 2048, 4096, 4096, 8192}},
  };
  for (const auto& c : cases) {
    auto s = make(1024, c.growth_interval, c.backoff_interval);
    EXPECT_EQ(run(s, c.updates), c.scales)
        << "growth_interval " << c.growth_interval << " backoff_interval " << c.backoff_interval
        << " updates " << c.updates;
  }
}

TEST(ScaleSchedule, TrackersCountAndReset) {
  auto s = make(8, 5, 3);
  run(s, "cc");
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_EQ(s.backoff_tracker(), 0);
  run(s, "ii");
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.backoff_tracker(), 2);
  run(s, "c");
  EXPECT_EQ(s.growth_tracker(), 1);
  EXPECT_EQ(s.backoff_tracker(), 0);
}

TEST(ScaleSchedule, GrowthGuardKeepsScaleFiniteAndStillResetsTracker) {
  // Issue behaviour 9(f): init 1e38, growth_factor 16, interval 1: stays 1e38.
  ScaleSchedule s(1e38, 16.0, 0.5, 1, 1, true);
  s.update(false);
  EXPECT_EQ(s.scale(), static_cast<float>(1e38));
  EXPECT_EQ(s.growth_tracker(), 0);
  // The largest float grows by nothing either.
  ScaleSchedule m(std::numeric_limits<float>::max(), 2.0, 0.5, 1, 1, true);
  m.update(false);
  EXPECT_EQ(m.scale(), std::numeric_limits<float>::max());
}

TEST(ScaleSchedule, ArithmeticIsDoubleRoundedOnceToFloat) {
  // As ATen's _amp_update_scale_: float(double(scale) * factor).
  ScaleSchedule s(3.0, 1.1, 0.3, 1, 1, true);
  s.update(false);
  EXPECT_EQ(s.scale(), static_cast<float>(3.0 * 1.1));
  s.update(true);
  EXPECT_EQ(s.scale(),
            static_cast<float>(static_cast<double>(static_cast<float>(3.0 * 1.1)) * 0.3));
}

TEST(ScaleSchedule, LoweredIntervalTriggersAtNextUpdateOfItsKind) {
  auto s = make(64, 10, 10);
  run(s, "ccccc");
  EXPECT_EQ(s.growth_tracker(), 5);
  s.set_growth_interval(2);  // the counter is already past the new interval
  s.update(false);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_EQ(s.growth_tracker(), 0);

  run(s, "iiii");
  EXPECT_EQ(s.backoff_tracker(), 4);
  s.set_backoff_interval(3);
  s.update(true);
  EXPECT_EQ(s.scale(), 64);
  EXPECT_EQ(s.backoff_tracker(), 0);
}

TEST(ScaleSchedule, NotDynamicNeverChanges) {
  auto s = make(512, 1, 1, /*dynamic=*/false);
  EXPECT_EQ(run(s, "ciicc"), (std::vector<double>{512, 512, 512, 512, 512}));
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.backoff_tracker(), 0);
}

TEST(ScaleSchedule, MinScaleFloorsBackoffs) {
  ScaleSchedule s(100, 2.0, 0.25, 10, 1, true, /*min_scale=*/10);
  EXPECT_EQ(run(s, "iii"), (std::vector<double>{25, 10, 10}));
  s.set_scale(5);  // below the floor: a backoff does not raise it
  EXPECT_EQ(run(s, "ic"), (std::vector<double>{5, 5}));
  EXPECT_EQ(ScaleSchedule::advance({100, 0, 0}, true, 2.0, 0.25, 10, 1, 10).scale, 25.0f);
  EXPECT_EQ(ScaleSchedule::advance({20, 0, 0}, true, 2.0, 0.25, 10, 1, 10).scale, 10.0f);
}

TEST(ScaleSchedule, SetScaleRoundsToFloatAndKeepsCounters) {
  auto s = make(8, 5, 5);
  run(s, "cc");
  s.set_scale(0.1);
  EXPECT_EQ(s.scale(), 0.1f);
  EXPECT_EQ(s.growth_tracker(), 2);
}

template <class F>
void expect_value_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected c10::ValueError mentioning " << needle;
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(needle), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(ScaleSchedule, ValidationNamesTheValueAndChangesNothing) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double bad : {0.0, -1.0, inf, nan, 1e39, 1e-50}) {
    expect_value_error([&] { make(bad, 1); }, "init_scale");
  }
  for (double bad : {1.0, 0.5, -2.0, inf, nan}) {
    expect_value_error([&] { ScaleSchedule(1, bad, 0.5, 1, 1, true); }, "growth_factor");
  }
  for (double bad : {0.0, 1.0, -0.5, 1.5, nan, inf}) {
    expect_value_error([&] { ScaleSchedule(1, 2.0, bad, 1, 1, true); }, "backoff_factor");
  }
  expect_value_error([&] { make(1, 0); }, "growth_interval must be >= 1, got 0");
  expect_value_error([&] { make(1, 1, -3); }, "backoff_interval must be >= 1, got -3");

  auto s = make(8, 4, 2);
  run(s, "c");
  expect_value_error([&] { s.set_scale(-1); }, "got -1");
  expect_value_error([&] { s.set_growth_factor(0.9); }, "got 0.9");
  expect_value_error([&] { s.set_backoff_factor(2); }, "got 2");
  expect_value_error([&] { s.set_growth_interval(0); }, "got 0");
  expect_value_error([&] { s.set_backoff_interval(0); }, "got 0");
  expect_value_error([&] { s.set_growth_tracker(-1); }, "growth_tracker");
  expect_value_error([&] { s.set_backoff_tracker(-1); }, "backoff_tracker");
  EXPECT_EQ(s.scale(), 8);
  EXPECT_EQ(s.growth_factor(), 2.0);
  EXPECT_EQ(s.backoff_factor(), 0.5);
  EXPECT_EQ(s.growth_interval(), 4);
  EXPECT_EQ(s.backoff_interval(), 2);
  EXPECT_EQ(s.growth_tracker(), 1);
  EXPECT_EQ(s.backoff_tracker(), 0);
}

}  // namespace
