#pragma once

// torchamp-train's command line: its options, the defaults the launch and
// the task fill in, and the checks that refuse an impossible run before
// anything is written.

#include "launch.h"
#include "run_folder.h"
#include "train.h"

#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>

namespace torchamp_train {

inline constexpr const char* kApp = "torchamp-train";

/// A bad option or an impossible run: the message, exit 2, nothing written.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// The command line.
struct Args {
  Config config;
  torchamp_apps::RunArgs run{"", "runs/"};
  std::string resume_dir;
  std::string parallel_mode = "data";
  bool lr_given = false, modes_given = false;
  std::set<std::string> given;  // the Config keys (options.txt's) given on the command line
};

/// Parses argv into `a`; returns -1 to go on, else the exit code.
int parse(int argc, char** argv, Args& a);

/// The launch environment's and the task's settings where the command line
/// gives none.
void complete(Config& config, const Args& a, const torchamp_apps::LaunchEnv& env);

/// The run folder: --resume's (its options adopted into `config`, an option
/// given here must agree with them), or --out's (one rule with every app:
/// new, or a run of these options to continue); either way the modes checked
/// against this LibTorch, machine and `world`.
torchamp_apps::RunFolder open_folder(const Args& a, Config& config, int world);

/// That `world` processes can share out the network (sharded) and every
/// batch of `train_rows` rows.
void check_shares(const Config& config, int world, int64_t train_rows);

}  // namespace torchamp_train
