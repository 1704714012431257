// torchamp-train: mixed-precision training on the UCI handwritten digits,
// once per precision mode, to show what loss scaling does: in the default
// task (a deep sigmoid classifier) float16 flushes the small activation
// gradients of the first layers to zero and the run stays at chance without
// a scaler, while the scaled run tracks float32 and the scale saw-tooths.
// Runs checkpoint (--checkpoint-every) and resume exactly (--resume).
//
// Exit codes: 0 done, 2 bad option or malformed data, 1 anything else.

#include "command_line.h"
#include "data.h"
#include "parallel.h"
#include "report.h"
#include "results.h"
#include "run_folder.h"
#include "train.h"

#include <torch/version.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <stdexcept>
#include <string>
using namespace torchamp_train;

namespace {

// A step's progress: the bar on a terminal, a line per epoch elsewhere.
void show_progress(torchamp_apps::Progress& progress, const StepRow& r, int epochs) {
  progress.at(r.mode, r.step, r.total);
  const int64_t per_epoch = std::max<int64_t>(1, r.total / epochs);
  progress.show(torchamp_apps::format("epoch %3d/%d  step %5lld/%lld  loss %.4f  scale %-8g  "
                                      "skipped %-4lld %6.0f steps/s  ETA %3.0fs",
                                      r.epoch + 1, epochs, static_cast<long long>(r.step + 1),
                                      static_cast<long long>(r.total), r.loss, r.scale,
                                      static_cast<long long>(r.skipped), progress.steps_per_s(),
                                      progress.eta_s()),
                (r.step + 1) % per_epoch == 0);
}

using torchamp_apps::RankLog;
using torchamp_apps::RunFolder;
using torchamp_apps::RunLogs;

// metrics.csv: a row per step, with the underflow of each of the task's
// activations.
std::string metrics_header(const Config& config) {
  std::string metrics =
      "step,mode,loss,scale,skipped,underflow_fraction,subnormal_fraction,epoch,test_accuracy";
  for (const auto& name : activation_names(find_task(config.task))) {
    metrics += ",underflow_" + name;
  }
  return metrics;
}

void write_step(RunLogs& logs, const std::string& mode, const StepRow& r) {
  auto& m = logs.metrics();
  m << r.step << "," << mode << "," << r.loss << "," << r.scale << "," << r.skipped << ","
    << r.underflow << "," << r.subnormal << "," << r.epoch << ",";
  if (!std::isnan(r.test_accuracy)) {
    m << r.test_accuracy;
  }
  for (const double u : r.layer_underflow) {
    m << "," << u;
  }
  m << "\n";
}

// Each rank's own record of its steps (ranks/rank<r>.csv): whether its own
// gradients held an inf/NaN and whether the step was skipped (on every rank
// the same, when the group agrees), so the ranks' decisions can be compared.
void write_rank_step(RankLog& log, const std::string& mode, const StepRow& r) {
  log.out() << mode << "," << r.step << "," << (r.found_inf_here ? 1 : 0) << ","
            << (r.skipped_here ? 1 : 0) << "," << r.scale << "," << r.loss << "\n";
}

// What the run is, before anything can kill the process.
void print_banner(const Config& config, const RunFolder& folder, const Parallel& parallel,
                  const Dataset& train, const Dataset& test, bool continuing, bool mkl_pinned) {
  std::cout << "torchamp-train: task " << config.task << " (" << find_task(config.task).summary
            << "); " << train.x.size(0) << " training and " << test.x.size(0)
            << " test images from " << config.data << "; " << config.epochs << " epochs, batch "
            << config.batch_size << ", " << (config.fused ? "torchamp's fused " : "LibTorch's ")
            << config.optimizer << (config.checkpoint_layers ? ", hidden layers checkpointed" : "")
            << ", lr " << config.lr << ", seed " << config.seed << "; "
            << (continuing ? "resuming" : "output") << " in " << folder.path("").string() << "\n";
  if (parallel.distributed()) {
    std::cout << parallel.world() << " processes over Gloo, "
              << (parallel.sharded() ? "sharded optimizer (each rank steps its shard; the "
                                       "scaler agrees on overflow over the group)"
                                     : "data-parallel (gradients all-reduced in buckets)")
              << ", global batch " << config.batch_size << "; every rank logs its steps in "
              << folder.path("ranks").string() << "/\n";
  }
  std::cout << folder.resume_line(config.modes.size()) << "LibTorch " << TORCH_VERSION
            << ": the fp16 modes "
            << (cpu_fp16_autocast() ? "run under CPU float16 autocast (matmuls in float16)"
                                    : "store activations in float16 between layers (no CPU "
                                      "float16 autocast before LibTorch 2.2)")
            << "\n"
            << torchamp_apps::determinism_line(config.deterministic, mkl_pinned)
            << std::endl;  // before anything can kill the process
}

// Trains the modes from the folder's position on, every rank; rank 0
// writes the logs, the checkpoints and the progress.
void train_modes(const Config& config, const Dataset& train, const Dataset& test, RunFolder& folder,
                 RankLog& rank_log, const Parallel& parallel, const torchamp_apps::RunArgs& run) {
  const bool root = parallel.rank() == 0;
  torchamp_apps::Progress progress(isatty(STDOUT_FILENO) != 0, 5);
  Hooks hooks = folder.hooks<StepRow>(run, root);
  hooks.step = [&](const StepRow& r) {
    write_rank_step(rank_log, r.mode, r);
    if (root) {
      write_step(folder.logs(), r.mode, r);
      show_progress(progress, r, config.epochs);
    }
  };
  hooks.bookmark = [&, logs = hooks.bookmark](Position& p) {  // a collective: every rank's log
    logs(p);
    p.rank_log_bytes = parallel.all_gather(rank_log.flush());
  };
  folder.run_modes<ModeResult>(
      config.modes.size(), root,
      [&](int64_t i, const std::string& from) {
        if (root) {
          const Mode& m = find_mode(config.modes[static_cast<size_t>(i)]);
          std::cout << torchamp_apps::slow_here(m.name,
                                                {cpu_autocast_dtype(m).value_or(at::kFloat)});
        }
        return train_mode(i, train, test, config, hooks, from, parallel);
      },
      [&](const ModeResult& done) { kSummary.write(folder.logs().summary(), done); },
      hooks.bookmark);
}

// The run after the command line: its folder (new, or one to continue), the
// checks, the group, the modes and the report.
int train(Args& a, const torchamp_apps::LaunchEnv& env) {
  Config config;
  RunFolder folder = open_folder(a, config, env.world);
  const bool mkl_pinned = config.deterministic && pin_mkl_to_one_thread();
  const Dataset all = load_digits(config.data);
  const auto [train, test] = split(all, 0.2, config.seed);
  if (folder.report_if_finished(config.modes.size(), env.rank, kApp,
                                [&] { print_table(std::cout, read_summaries(folder.logs())); })) {
    return 0;
  }
  check_shares(config, env.world, train.x.size(0));
  const Parallel parallel =
      env.world <= 1 ? Parallel() : form_parallel(env, config.parallel, a.run.timeout());
  // Rank 0 sets up the folder; the others write their logs into it only
  // after (a collective is the barrier).
  const bool root = parallel.rank() == 0;  // writes the table, logs, plots and checkpoints
  const bool continuing = folder.continuing();
  if (root) {
    folder.start_or_resume(config.to_map(), metrics_header(config), kSummary.header());
    if (!continuing) {
      save_initial(folder.path(torchamp_apps::run_files::kInitial).string(), config, train, test);
    }
  }
  parallel.all_gather(0);
  RankLog rank_log =
      folder.open_rank_log(parallel.rank(), "mode,step,found_inf_here,skipped,scale,loss");
  if (root) {
    print_banner(config, folder, parallel, train, test, continuing, mkl_pinned);
  }
  train_modes(config, train, test, folder, rank_log, parallel, a.run);
  if (root) {
    report(folder, config);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return torchamp_apps::app_main<Args>(kApp, argc, argv, parse, [](Args& a) {
    const auto env = torchamp_apps::LaunchEnv::from_environment();
    complete(a.config, a, env);
    try {
      return train(a, env);
    } catch (const DataError& e) {
      throw std::invalid_argument(std::string("--data: ") + e.what());
    }
  });
}
