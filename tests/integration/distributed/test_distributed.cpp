// Agreement on overflow across ranks: real processes (tests/integration/tools/dist_worker)
// over loopback, with a c10d::FileStore and Gloo process groups.

#include "dist_util.h"

namespace {

using torchamp_test::expect_every_rank;
using torchamp_test::run_ranks;

class Agree : public ::testing::TestWithParam<int> {};

TEST_P(Agree, InfOnOneRankSkipsTheStepOnEveryRankAndScalesStayEqual) {
  // init 256, growth every clean step: 512, then the inf: 256, then 512.
  expect_every_rank("agree", GetParam(),
                    {
                        "step 0 stepped 1 scale 512 growth 0 backoff 0",
                        "step 1 stepped 0 scale 256 growth 0 backoff 0",
                        "step 2 stepped 1 scale 512 growth 0 backoff 0",
                    });
}

TEST_P(Agree, NoInfAnywhereEveryRankSteps) {
  expect_every_rank("clean", GetParam(),
                    {
                        "step 0 stepped 1 scale 512 growth 0 backoff 0",
                        "step 1 stepped 1 scale 1024 growth 0 backoff 0",
                        "step 2 stepped 1 scale 2048 growth 0 backoff 0",
                    });
}

// torchamp's fused AdamW: the scaler only checks (and agrees on) the
// gradients and the update unscales them; the skipped step does not count.
TEST_P(Agree, WithAFusedOptimizerTheSkippedStepDoesNotCountOnAnyRank) {
  expect_every_rank("agree-fused", GetParam(),
                    {
                        "step 0 stepped 1 scale 512 growth 0 backoff 0",
                        "step 1 stepped 0 scale 256 growth 0 backoff 0",
                        "step 2 stepped 1 scale 512 growth 0 backoff 0",
                        "adamw steps 2",
                        "adamw steps 2",
                    });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Agree, ::testing::Values(2, 4));

class Sharded : public ::testing::TestWithParam<const char*> {};

TEST_P(Sharded, ShardedTrainingMatchesASingleProcess) {
  const std::string suffix = GetParam();
  const auto ranks = run_ranks("sharded" + suffix, 2);
  const auto single = run_ranks("single" + suffix, 1)[0];
  ASSERT_EQ(ranks[0], ranks[1]) << "ranks disagree (steps, scale or parameters)";
  ASSERT_EQ(ranks[0].size(), single.size());
  int skipped = 0;
  for (size_t i = 0; i < single.size(); ++i) {
    if (single[i].rfind("step", 0) == 0) {
      EXPECT_EQ(ranks[0][i], single[i]);  // same skipped steps, same scale
      skipped += single[i].find("stepped 0") != std::string::npos;
    } else {
      const double a = std::stod(ranks[0][i].substr(6));
      const double b = std::stod(single[i].substr(6));
      EXPECT_NEAR(a, b, 1e-5 + 1e-5 * std::abs(b)) << "line " << i;
    }
  }
  EXPECT_EQ(skipped, 2);  // steps 2 and 5, on both ranks
}

// LibTorch's SGD (the scaler unscales), torchamp's fused SGD (it only checks).
INSTANTIATE_TEST_SUITE_P(Optimizers, Sharded, ::testing::Values("", "-fused"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param[0] ? "Fused" : "LibTorch");
                         });

TEST(Distributed, ARankThatExitsMidStepGivesTheOthersAnErrorNotAHang) {
  const auto outputs = run_ranks("exit", 2);
  const auto& out = outputs[0];
  ASSERT_GE(out.size(), 4u) << (out.empty() ? "" : out.back());
  EXPECT_EQ(out[0], "step 0 ok scale 512 growth 0 backoff 0");
  ASSERT_EQ(out[1].rfind("error after_ms ", 0), 0u) << out[1];
  EXPECT_LT(std::stoi(out[1].substr(15)), 3000 + 2000);  // the timeout, plus slack
  EXPECT_NE(out[2].find("the all-reduce of found_inf over the process group failed on rank 0 "
                        "of 2; nothing was unscaled and no stage changed."),
            std::string::npos)
      << out[2];
  EXPECT_EQ(out[3], "unchanged 1 1");  // scale, trackers and gradients
}

TEST(Distributed, NewGroupsAreFormedOverTheDefaultGroupsRendezvous) {
  const auto outputs = run_ranks("new-group", 3);
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_EQ(outputs[0], (std::vector<std::string>{"default 0 of 3 sum 6", "all 0 of 3 sum 6",
                                                  "ends 0 of 2 sum 4"}));
  EXPECT_EQ(outputs[1],
            (std::vector<std::string>{"default 1 of 3 sum 6", "all 1 of 3 sum 6", "ends none"}));
  EXPECT_EQ(outputs[2], (std::vector<std::string>{"default 2 of 3 sum 6", "all 2 of 3 sum 6",
                                                  "ends 1 of 2 sum 4"}));
}

}  // namespace
