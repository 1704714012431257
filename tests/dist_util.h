#pragma once

// Starting the ranks of a distributed test scenario as real processes
// (tests/integration/tools/dist_worker, built beside the test programs) and
// reading what each one wrote.

#include <gtest/gtest.h>

#include "../apps/common/remove_tree.h"

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

namespace torchamp_test {

namespace fs = std::filesystem;

// The rank program: dist_worker beside this test program. (Not a path
// compiled in: a compile line naming the build folder would miss ccache in
// every other clone.)
inline std::string dist_worker() {
  return (fs::read_symlink("/proc/self/exe").parent_path() / "dist_worker").string();
}

inline std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  return lines;
}

// Starts WORLD ranks of `scenario`; waits (at most 60 s, then kills them);
// returns each rank's output lines.
inline std::vector<std::vector<std::string>> run_ranks(const std::string& scenario, int world) {
  const fs::path dir =
      fs::path(::testing::TempDir()) /
      ("dist-" + scenario + "-" + std::to_string(world) + "-" + std::to_string(::getpid()));
  torchamp_apps::remove_tree(dir.string());
  fs::create_directories(dir);
  const std::string store = (dir / "store").string();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> args = {
        dist_worker(),         scenario, std::to_string(rank),
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
  if (!::testing::Test::HasFailure()) {  // a failure's files stay, to be read
    torchamp_apps::remove_tree(dir.string());
  }
  return outputs;
}

// Runs `scenario` on `world` ranks; every rank must print `expected`.
inline void expect_every_rank(const std::string& scenario, int world,
                              const std::vector<std::string>& expected) {
  for (const auto& out : run_ranks(scenario, world)) {
    EXPECT_EQ(out, expected);
  }
}

}  // namespace torchamp_test
