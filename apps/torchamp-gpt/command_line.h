#pragma once

// torchamp-gpt's command line: its options, the model sizes they start
// from, and the checks that refuse an impossible run before anything is
// written.

#include "run_folder.h"
#include "train.h"

#include <cstdint>
#include <string>

namespace torchamp_gpt {

inline constexpr const char* kApp = "torchamp-gpt";

/// The command line.
struct Args {
  Config config;
  std::string size = "small";
  torchamp_apps::RunArgs run{"", "runs/gpt-"};
  std::string report_dir;
  bool list_modes = false;
  int64_t sample_chars = 200;
  int64_t log_every = 0;
  int threads = 0;
  bool cuda_graph = false;
  int64_t profile_steps = 0;
};

/// Parses argv into `a`; returns -1 to go on, else the exit code.
int parse(int argc, char** argv, Args& a);

/// Throws std::invalid_argument for what makes the run impossible; nothing is
/// written before this passes.
void check(const Config& c);

}  // namespace torchamp_gpt
