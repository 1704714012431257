#pragma once

// The command-line options every app under apps/ shares (CLI11): the run
// folder, its checkpoints, the collectives' timeout and MKL's determinism,
// read into RunArgs (run_folder.h). Header-only: the apps link CLI11, the
// app support library does not.

#include "run_folder.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace torchamp_apps {

/// --out, --checkpoint-every, --timeout and --deterministic /
/// --nondeterministic (into `deterministic`, an option of the numbers);
/// returns --out's option (for an app's own options that exclude it).
inline CLI::Option* add_run_options(CLI::App& app, RunArgs& a, bool& deterministic) {
  CLI::Option* out = app.add_option(
      "--out", a.out,
      "Run folder (default " + a.default_prefix +
          "<date-time>/; give it on more than one process). One that holds a run of the same "
          "options continues it from its last checkpoint (the same command again, or torchrun "
          "--max-restarts); one of other options is an error");
  app.add_option("--checkpoint-every", a.checkpoint_every,
                 "Checkpoint (model, optimizer, scaler) every N steps into the run folder (0: "
                 "none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--timeout", a.timeout_s,
                 "Seconds any collective may wait for the other ranks before this one fails")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  app.add_flag("--deterministic,!--nondeterministic", deterministic,
               "MKL (the BLAS of the pip wheels' LibTorch) on one thread, so that the same "
               "command writes the same numbers every run (default); --nondeterministic: MKL's "
               "own threads, whose float32 matmuls may then differ in the last bits from run to "
               "run");
  return out;
}

/// Parses argv with `app`: -1 to go on, else the exit code (0 after --help,
/// 2 for a bad option, whose message CLI11 has printed).
inline int parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

/// The GradScaler's settings every app exposes: --init-scale, --growth-interval.
inline void add_scaler_options(CLI::App& app, double& init_scale, int64_t& growth_interval) {
  app.add_option("--init-scale", init_scale, "GradScaler initial scale")
      ->check(CLI::Range(1e-38, 3.4e38))
      ->capture_default_str();
  app.add_option("--growth-interval", growth_interval,
                 "GradScaler growth interval (clean steps before the scale doubles)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
}

}  // namespace torchamp_apps
