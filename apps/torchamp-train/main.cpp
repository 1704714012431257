// torchamp-train: mixed-precision training on the UCI handwritten digits,
// once per precision mode, to show what loss scaling does: in the default
// task (a deep sigmoid classifier) float16 flushes the small activation
// gradients of the first layers to zero and the run stays at chance without
// a scaler, while the scaled run tracks float32 and the scale saw-tooths.
// Runs checkpoint (--checkpoint-every) and resume exactly (--resume).
//
// Exit codes: 0 done, 2 bad option or malformed data, 1 anything else.

#include "cli.h"
#include "data.h"
#include "parallel.h"
#include "report.h"
#include "run_folder.h"
#include "train.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
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

std::string percent(double f) {
  return torchamp_apps::format("%.2f%%", 100.0 * f);
}

// summary.csv: a row per finished mode.
const torchamp_apps::Columns<ModeResult> kSummary{{"mode", &ModeResult::mode},
                                                  {"scaled", &ModeResult::scaled},
                                                  {"final_loss", &ModeResult::final_loss},
                                                  {"test_accuracy", &ModeResult::test_accuracy},
                                                  {"skipped", &ModeResult::skipped},
                                                  {"final_scale", &ModeResult::final_scale},
                                                  {"underflow", &ModeResult::underflow},
                                                  {"subnormal", &ModeResult::subnormal},
                                                  {"seconds", &ModeResult::seconds},
                                                  {"step_ms", &ModeResult::step_ms},
                                                  {"train_step_ms", &ModeResult::train_step_ms},
                                                  {"bytes_per_param", &ModeResult::bytes_per_param},
                                                  {"peak_rss_mb", &ModeResult::peak_rss_mb}};

using torchamp_apps::Options;

const char* const kApp = "torchamp-train";

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

std::vector<ModeResult> read_summaries(RunLogs& logs) {
  return kSummary.read_all(logs.summary_rows());
}

// Each rank's own record of its steps (ranks/rank<r>.csv): whether its own
// gradients held an inf/NaN and whether the step was skipped (on every rank
// the same, when the group agrees), so the ranks' decisions can be compared.
void write_rank_step(RankLog& log, const std::string& mode, const StepRow& r) {
  log.out() << mode << "," << r.step << "," << (r.found_inf_here ? 1 : 0) << ","
            << (r.skipped_here ? 1 : 0) << "," << r.scale << "," << r.loss << "\n";
}

void print_table(std::ostream& os, const std::vector<ModeResult>& results) {
  using torchamp_apps::format;
  torchamp_apps::Table table({"mode", "final train loss", "test accuracy", "skipped steps",
                              "final scale", "fp16-flushed act. grads", "fp16-subnormal act. grads",
                              "optimizer step", "training step", "wall time", "bytes/param",
                              "peak RSS"});
  for (const auto& r : results) {
    table.add({r.mode, format("%.4f", r.final_loss), format("%.2f%%", 100.0 * r.test_accuracy),
               std::to_string(r.skipped), format("%g", r.final_scale), percent(r.underflow),
               percent(r.subnormal), format("%.3f ms", r.step_ms),
               format("%.3f ms", r.train_step_ms), format("%.1f s", r.seconds),
               format("%.1f", r.bytes_per_param), format("%.0f MB", r.peak_rss_mb)});
  }
  os << "\n";
  table.print(os);
}

// The plots' data from metrics.csv's rows, a block a mode: steps (step loss
// scale underflow skipped-here layers...) and epochs (epoch test-accuracy).
void write_plot_data(const fs::path& steps_data, const fs::path& epochs_data, size_t layers,
                     const std::vector<std::vector<std::string>>& rows,
                     const std::vector<std::string>& modes) {
  std::string mode, skipped_before;
  torchamp_apps::write_mode_blocks(steps_data, rows, 1, modes, [&](const auto& v) {
    if (v.size() < 9 + layers) {
      return std::string();
    }
    if (v[1] != mode) {
      mode = v[1];
      skipped_before = "0";
    }
    std::string line =
        v[0] + " " + v[2] + " " + v[3] + " " + v[5] + " " + (v[4] != skipped_before ? "1" : "0");
    for (size_t l = 0; l < layers; ++l) {
      line += " " + v[9 + l];
    }
    skipped_before = v[4];
    return line;
  });
  torchamp_apps::write_mode_blocks(epochs_data, rows, 1, modes, [&](const auto& v) {
    return v.size() < 9 + layers || v[8].empty() ? std::string()
                                                 : std::to_string(std::stoi(v[7]) + 1) + " " + v[8];
  });
}

// loss.png, scale.png, accuracy.png, underflow.png, underflow-layers.png.
bool plot(const fs::path& out, const Config& config,
          const std::vector<std::vector<std::string>>& rows,
          const std::vector<ModeResult>& results) {
  const Task& task = find_task(config.task);
  const std::vector<std::string> layers = activation_names(task);
  const fs::path steps_data = out / "plot-steps.txt", epochs_data = out / "plot-epochs.txt";
  std::vector<std::string> modes;
  for (const auto& r : results) {
    modes.push_back(r.mode);
  }
  write_plot_data(steps_data, epochs_data, layers.size(), rows, modes);
  const std::string d = "'" + steps_data.string() + "'";
  torchamp_apps::Figures figures(out, "set grid\nset key top right\nset xlabel 'step'\n");
  figures.figure("loss.png", "set title 'Training loss per step (" + task.name + ": " +
                                 task.summary.substr(0, 40) +
                                 "...)' noenhanced\nset ylabel 'cross-entropy (batch)'\n"
                                 "set logscale y\n");
  figures.each_mode(steps_data, modes, "1:2");
  figures.figure("scale.png",
                 "set title 'Loss scale per step (the sawtooth); crosses: skipped steps'\n"
                 "set ylabel 'scale'\nset logscale y 2\nset format y '2^{%L}'\n");
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].scaled) {
      const std::string block = d + " index " + std::to_string(i), lc = std::to_string(i + 1);
      figures.series(block + " using 1:3 with steps lw 1.5 lc " + lc + " title '" +
                     results[i].mode + "' noenhanced");
      figures.series(block + " using 1:($5 > 0 ? $3 : NaN) with points pt 2 ps 1.5 lc " + lc +
                     " notitle");
    }
  }
  figures.figure("accuracy.png",
                 "set title 'Test accuracy after each epoch'\nset xlabel 'epoch'\n"
                 "set ylabel 'test accuracy'\nunset logscale y\nset format y '%.0f%%'\n"
                 "set key bottom right\n");
  figures.each_mode(epochs_data, modes, "1:($2*100)");
  figures.figure("underflow.png",
                 "set title 'Activation-gradient entries that are zero in float16 (fp32/bf16: "
                 "would be)'\nset xlabel 'step'\nset key top right\n"
                 "set ylabel 'share of all entries'\n");
  figures.each_mode(steps_data, modes, "1:($4*100)");
  // Per layer, for the float16 modes.
  figures.figure("underflow-layers.png",
                 "set title 'Per activation: entries of its gradient zero in float16 (solid: "
                 "fp16, dashed: fp16+scaler)'\nset key outside right\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const bool scaled = results[i].mode == "fp16+scaler";
    if (results[i].mode != "fp16" && !scaled) {
      continue;
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      figures.series(d + " index " + std::to_string(i) + " using 1:($" + std::to_string(6 + l) +
                     "*100) with lines lw 1.2 lc " + std::to_string(l + 1) +
                     (scaled ? " dt 2" : "") + " title '" + layers[l] +
                     (scaled ? " (scaled)" : "") + "' noenhanced");
    }
  }
  return figures.draw("plots.gp", {steps_data, epochs_data});
}

std::string task_help() {
  std::string s = "Workload:";
  for (const auto& t : tasks()) {
    s += "\n  " + t.name + (&t == &tasks().front() ? " (default)" : "") + ": " + t.summary;
  }
  return s;
}

// A bad option or an impossible run: the message, exit 2, nothing written.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The command line.
struct Args {
  Config config;
  torchamp_apps::RunArgs run{"", "runs/"};
  std::string resume_dir;
  std::string parallel_mode = "data";
  bool lr_given = false, modes_given = false;
  std::set<std::string> given;  // the Config keys (options.txt's) given on the command line
};

// The options of the workload and its training.
void add_training_options(CLI::App& app, Config& config, int64_t& seed) {
  const auto task_names = torchamp_apps::names_of(tasks());
  config.task = task_names.front();
  app.add_option("--task", config.task, task_help())
      ->check(CLI::IsMember(task_names))
      ->capture_default_str();
  app.add_option("--epochs", config.epochs, "Epochs per mode (default: the task's)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--batch-size", config.batch_size, "Mini-batch size (default: the task's)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--lr", config.lr,
                 "Learning rate (default: the task's with its optimizer; else 0.05 for SGD, 0.003 "
                 "for Adam and AdamW)")
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", config.optimizer,
                 "sgd (momentum 0.9), adam or adamw (weight decay 1e-4) (default: the task's)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_flag("--fused", config.fused,
               "torchamp::optim's fused optimizer (the scaler unscales inside its update) "
               "instead of LibTorch's");
  app.add_flag("--checkpoint-layers", config.checkpoint_layers,
               "Activation checkpointing: keep each hidden layer's input instead of its "
               "activations and recompute them in backward (torchamp::checkpoint); the same "
               "numbers bit for bit, less memory, more time");
  app.add_option("--modes", config.modes, "Modes to run, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(known_modes()))
      ->capture_default_str();
  app.add_option("--seed", seed, "Seed of the split, initial weights and batch order")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

// The options of the run around it (apps/common/cli.h's, and --resume),
// the scaler's settings, the data and the processes.
void add_run_options(CLI::App& app, Args& a) {
  Config& config = a.config;
  CLI::Option* out = torchamp_apps::add_run_options(app, a.run, config.deterministic);
  app.add_option("--resume", a.resume_dir,
                 "Continue the run in this folder from its last checkpoint (instead of --out; "
                 "options given must match the run's)")
      ->excludes(out);
  torchamp_apps::add_scaler_options(app, config.init_scale, config.growth_interval);
  app.add_option("--data", config.data, "CSV (optionally .gz): 64 pixel columns 0..16, then label")
      ->capture_default_str();
  app.add_option("--parallel", a.parallel_mode,
                 "Under torchrun (WORLD_SIZE > 1): data (each rank a slice of every batch, "
                 "gradients all-reduced) or sharded (each rank steps its shard of the parameters "
                 "and optimizer state; the scaler agrees on overflow over the group). "
                 "--batch-size stays the global batch")
      ->check(CLI::IsMember({"data", "sharded"}))
      ->capture_default_str();
}

// Parses argv into `a`; returns -1 to go on, else the exit code.
int parse(int argc, char** argv, Args& a) {
  CLI::App app{
      "torchamp-train: mixed-precision training on the UCI handwritten digits, once per "
      "precision mode, comparing float32, float16 without and with loss scaling, and bfloat16."};
  Config& config = a.config;
  config.data = torchamp_apps::default_data("digits.csv.gz", torchamp_apps::built_data_path());
  config.modes = default_modes();
  int64_t seed = 0;
  add_training_options(app, config, seed);
  add_run_options(app, a);
  if (const int rc = torchamp_apps::parse_command_line(app, argc, argv); rc >= 0) {
    return rc;
  }
  config.seed = static_cast<uint64_t>(seed);
  a.lr_given = app.count("--lr") > 0;
  a.modes_given = app.count("--modes") > 0;
  for (const auto& kv : config.to_map()) {
    const CLI::Option* option = app.get_option_no_throw("--" + kv.first);
    if (option != nullptr && option->count() > 0) {
      a.given.insert(kv.first);
    }
  }
  return -1;
}

// The launch environment's and the task's settings where the command line
// gives none.
void complete(Config& config, const Args& a, const torchamp_apps::LaunchEnv& env) {
  config.world_size = env.world;
  config.parallel = env.world > 1 ? a.parallel_mode : "none";
  const Task& task = find_task(config.task);
  if (config.epochs == 0) {
    config.epochs = task.epochs;
  }
  if (config.batch_size == 0) {
    config.batch_size = task.batch_size;
  }
  if (config.optimizer.empty()) {
    config.optimizer = task.optimizer;
  }
  if (!a.lr_given) {
    config.lr = config.optimizer == task.optimizer ? task.lr
                : config.optimizer == "sgd"        ? 0.05
                                                   : 0.003;
  }
}

// --resume: the run's own settings; an option given here must agree with them.
Config adopt_saved(const Args& a, const RunFolder& folder, int world) {
  const Options& saved = folder.saved_options();
  for (const auto& [key, value] : a.config.to_map()) {
    const auto it = saved.find(key);
    if (a.given.count(key) > 0 && (it == saved.end() || it->second != value)) {
      throw UsageError("--resume: --" + key + " is " + value + " here but " +
                       (it == saved.end() ? std::string("absent") : it->second) + " in " +
                       a.resume_dir + "/" + torchamp_apps::run_files::kOptions);
    }
  }
  Config config = Config::from_map(saved);
  // The checkpoint holds one optimizer shard per rank of the run.
  if (config.world_size != world) {
    throw UsageError("--resume: the run in " + a.resume_dir + " ran on " +
                     std::to_string(config.world_size) +
                     " process(es) (world-size in its options), this one on " +
                     std::to_string(world) + ": resume with the same number");
  }
  return config;
}

// The modes this LibTorch and machine run, and the processes the network
// and the batches can be shared out to.
void check_runnable(Config& config, const Args& a, int world) {
  const std::vector<std::string> here = available_modes();
  for (const auto& m : config.modes) {
    if (std::find(here.begin(), here.end(), m) == here.end()) {
      throw UsageError("--modes: " + m + " needs a CUDA build of LibTorch and a GPU");
    }
  }
  // The collectives run on CPU tensors over Gloo; NCCL is not wired up. The
  // default modes then leave the CUDA one out; asking for it is an error.
  const auto cuda_mode = std::find(config.modes.begin(), config.modes.end(), "cuda-fp16+scaler");
  if (world > 1 && cuda_mode != config.modes.end()) {
    if (a.modes_given || !a.resume_dir.empty()) {
      throw UsageError(
          "--modes: cuda-fp16+scaler runs on one process only (several processes train on the "
          "CPU over Gloo; NCCL is not supported yet)");
    }
    config.modes.erase(cuda_mode);
  }
}

void check_shares(const Config& config, int world, int64_t train_rows) {
  // Sharded, every rank owns a parameter (the network has two per layer).
  const int n_params = 2 * (find_task(config.task).hidden_layers + 1);
  if (config.parallel == "sharded" && world > n_params) {
    throw UsageError("--parallel sharded: " + std::to_string(world) + " processes but the " +
                     config.task + " network has " + std::to_string(n_params) +
                     " parameters to share out");
  }
  // Every rank needs a row of every batch.
  const int64_t last_batch = train_rows % config.batch_size;
  if (config.batch_size < world || (last_batch != 0 && last_batch < world)) {
    throw UsageError("--batch-size: " + std::to_string(config.batch_size) + " leaves an epoch's " +
                     (config.batch_size < world ? "batches" : "last batch") + " with " +
                     std::to_string(config.batch_size < world ? config.batch_size : last_batch) +
                     " rows, fewer than the " + std::to_string(world) + " processes");
  }
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

// The table and the plots of a run folder's finished modes.
void report(RunFolder& folder, const Config& config) {
  const std::vector<ModeResult> results = read_summaries(folder.logs());
  print_table(std::cout, results);
  std::cout << "\nwrote " << folder.path(torchamp_apps::run_files::kMetrics).string() << " and "
            << torchamp_apps::run_files::kSummary << "\n";
  if (plot(folder.dir(), config, folder.logs().metrics_rows(), results)) {
    std::cout << "wrote loss.png, scale.png, accuracy.png, underflow.png and "
                 "underflow-layers.png there\n";
  } else {
    std::cout << "gnuplot not found (Debian: apt-get install gnuplot-nox): no plots, the CSV "
                 "has everything\n";
  }
}

// The run folder: --resume's (its options adopted), or --out's (one rule
// with every app: new, or a run of these options to continue).
RunFolder open_folder(const Args& a, Config& config, int world) {
  if (!a.resume_dir.empty()) {
    RunFolder folder = RunFolder::existing(a.resume_dir, kApp);
    config = adopt_saved(a, folder, world);
    check_runnable(config, a, world);
    return folder;
  }
  config = a.config;
  check_runnable(config, a, world);
  return RunFolder::open(a.run, world, config.to_map(), kApp);
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
