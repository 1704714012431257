// Agreement on overflow across ranks: real processes (tests/tools/dist_worker)
// over loopback, with a c10d::FileStore and Gloo process groups.

#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

// Starts WORLD ranks of `scenario`; waits (at most 60 s, then kills them);
// returns each rank's output lines.
std::vector<std::vector<std::string>> run_ranks(const std::string& scenario, int world) {
  const fs::path dir =
      fs::path(::testing::TempDir()) /
      ("dist-" + scenario + "-" + std::to_string(world) + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> args = {
        TORCHAMP_DIST_WORKER,  scenario, std::to_string(rank),
        std::to_string(world), store,    (dir / std::to_string(rank)).string()};
    std::vector<char*> argv;
    for (auto& a : args) {
      argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    pid_t pid = 0;
    EXPECT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) {
          kill(p, SIGKILL);
        }
        ADD_FAILURE() << "ranks still running after 60 s: a hang";
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank failed";
  }
  std::vector<std::vector<std::string>> outputs;
  for (int rank = 0; rank < world; ++rank) {
    outputs.push_back(read_lines(dir / std::to_string(rank)));
  }
  return outputs;
}

// Runs `scenario` on `world` ranks; every rank must print `expected`.
void expect_every_rank(const std::string& scenario, int world,
                       const std::vector<std::string>& expected) {
  for (const auto& out : run_ranks(scenario, world)) {
    EXPECT_EQ(out, expected);
  }
}

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

}  // namespace
