// torchamp-train: mixed-precision training on the UCI handwritten digits,
// once per precision mode, to show what loss scaling does: in the default
// task (a deep sigmoid classifier) float16 flushes the small activation
// gradients of the first layers to zero and the run stays at chance without
// a scaler, while the scaled run tracks float32 and the scale saw-tooths.
// Runs checkpoint (--checkpoint-every) and resume exactly (--resume).
//
// Exit codes: 0 done, 2 bad option or malformed data, 1 anything else.

#include "data.h"
#include "parallel.h"
#include "train.h"

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#ifndef TORCHAMP_TRAIN_DEFAULT_DATA
#define TORCHAMP_TRAIN_DEFAULT_DATA "data/digits.csv.gz"
#endif

namespace fs = std::filesystem;
using namespace torchamp_train;

namespace {

// A live bar on a terminal, a plain line per epoch otherwise; the rate and
// time left count from where this process started the mode (a resumed mode
// starts mid-way).
class ProgressPrinter {
 public:
  ProgressPrinter(bool tty, int epochs) : tty_(tty), epochs_(epochs) {}

  void operator()(const std::string& mode, const StepRecord& r, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (mode != mode_) {
      mode_ = mode;
      start_ = now;
      first_ = r.step;
    }
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(r.step + 1 - first_) / elapsed : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total - r.step - 1) / rate : 0.0;
    const bool last = r.step + 1 == total;
    const int64_t per_epoch = std::max<int64_t>(1, total / epochs_);
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %3d/%d  step %5lld/%lld  loss %.4f  scale %-8g  skipped %-4lld %6.0f "
                  "steps/s  ETA %3.0fs",
                  r.epoch + 1, epochs_, static_cast<long long>(r.step + 1),
                  static_cast<long long>(total), r.loss, r.scale, static_cast<long long>(r.skipped),
                  rate, eta);
    if (tty_) {
      if (r.step % 5 == 0 || last) {
        const int width = 24;
        const auto filled = static_cast<int>(width * (r.step + 1) / total);
        std::cout << "\r\033[K" << std::left << std::setw(19) << mode << "["
                  << std::string(filled, '#') << std::string(width - filled, '.') << "] " << line
                  << std::flush;
      }
      if (last) {
        std::cout << "\n";
      }
    } else if (last || (r.step + 1) % per_epoch == 0) {
      std::cout << std::left << std::setw(19) << mode << line << "\n";
    }
  }

 private:
  bool tty_;
  int epochs_;
  std::string mode_;
  int64_t first_ = 0;
  std::chrono::steady_clock::time_point start_;
};

// The data path when --data is not given: the repository's copy, else the
// one installed beside the program (<prefix>/share/torchamp/).
std::string default_data_path() {
  if (fs::exists(TORCHAMP_TRAIN_DEFAULT_DATA)) {
    return TORCHAMP_TRAIN_DEFAULT_DATA;
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path installed = exe.parent_path().parent_path() / "share/torchamp/digits.csv.gz";
  return !ec && fs::exists(installed) ? installed.string() : TORCHAMP_TRAIN_DEFAULT_DATA;
}

std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * f);
  return buf;
}

const char* const kSummaryHeader =
    "mode,scaled,final_loss,test_accuracy,skipped,final_scale,underflow,subnormal,seconds,step_ms,"
    "train_step_ms,bytes_per_param,peak_rss_mb";

using torchamp_apps::g17;
using torchamp_apps::Options;

// The files of a run folder: config.txt (the settings), metrics.csv (a row
// per step, appended as the run goes), summary.csv (a row per finished mode),
// checkpoint.pt, initial.pt (the initial weights and the split, for Python).
class RunFolder {
 public:
  explicit RunFolder(fs::path dir) : dir_(std::move(dir)), logs_(dir_) {}

  fs::path path(const char* name) const { return dir_ / name; }
  std::string checkpoint() const { return path("checkpoint.pt").string(); }

  // A fresh run: the settings and the two CSV headers; an older run's
  // checkpoint and rank logs in the same folder are removed.
  void start(const Config& config) {
    fs::create_directories(dir_);
    torchamp_apps::write_options(path("config.txt").string(), config.to_map());
    fs::remove(checkpoint());
    fs::remove_all(path("ranks"));  // an earlier run's, perhaps on more processes
    std::string metrics =
        "step,mode,loss,scale,skipped,underflow_fraction,subnormal_fraction,epoch,test_accuracy";
    for (const auto& name : activation_names(find_task(config.task))) {
      metrics += ",underflow_" + name;
    }
    logs_.start(metrics, kSummaryHeader);
  }

  // Continuing at `p`: whatever the killed process wrote after its last
  // checkpoint goes.
  void resume(const Position& p) { logs_.resume(p); }

  Options read_config() const {
    if (!fs::exists(path("config.txt"))) {
      throw std::runtime_error("--resume: no config.txt in " + dir_.string() +
                               " (not a torchamp-train run folder)");
    }
    return torchamp_apps::read_options(path("config.txt").string());
  }

  void step(const std::string& mode, const StepRecord& r) {
    auto& m = logs_.metrics();
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

  void finished(const ModeSummary& m) {
    logs_.summary() << m.mode << "," << (m.scaled ? 1 : 0) << "," << g17(m.final_loss) << ","
                    << g17(m.test_accuracy) << "," << m.skipped << "," << g17(m.final_scale) << ","
                    << g17(m.underflow) << "," << g17(m.subnormal) << "," << g17(m.seconds) << ","
                    << g17(m.step_ms) << "," << g17(m.train_step_ms) << ","
                    << g17(m.bytes_per_param) << "," << g17(m.peak_rss_mb) << "\n";
  }

  // Flushes both logs and records their sizes (a checkpoint's bookmark).
  void bookmark(Position& p) { logs_.bookmark(p); }

  std::vector<ModeSummary> summaries() {
    std::vector<ModeSummary> all;
    for (const auto& v : logs_.summary_rows()) {
      if (v.size() != 13) {
        std::string line;
        for (const auto& cell : v) {
          line += (line.empty() ? "" : ",") + cell;
        }
        throw std::runtime_error("malformed summary.csv line: " + line);
      }
      ModeSummary m;
      m.mode = v[0];
      m.scaled = v[1] == "1";
      m.final_loss = std::stod(v[2]);
      m.test_accuracy = std::stod(v[3]);
      m.skipped = std::stoll(v[4]);
      m.final_scale = std::stod(v[5]);
      m.underflow = std::stod(v[6]);
      m.subnormal = std::stod(v[7]);
      m.seconds = std::stod(v[8]);
      m.step_ms = std::stod(v[9]);
      m.train_step_ms = std::stod(v[10]);
      m.bytes_per_param = std::stod(v[11]);
      m.peak_rss_mb = std::stod(v[12]);
      all.push_back(m);
    }
    return all;
  }

  // metrics.csv's rows, for the plots.
  std::vector<std::vector<std::string>> metrics() { return logs_.metrics_rows(); }

 private:
  fs::path dir_;
  torchamp_apps::RunLogs logs_;
};

// Each rank's own record of its steps, ranks/rank<r>.csv: whether its own
// gradients held an inf/NaN and whether the step was skipped (on every rank
// the same, when the group agrees), so the ranks' decisions can be compared.
class RankLog {
 public:
  RankLog(const fs::path& dir, int rank)
      : path_(dir / "ranks" / ("rank" + std::to_string(rank) + ".csv")) {}

  void start() {
    fs::create_directories(path_.parent_path());
    std::ofstream(path_) << "mode,step,found_inf_here,skipped,scale,loss\n";
    open();
  }
  // Back to its size at the checkpoint (what this rank wrote after it goes).
  void resume(const Position& p, int rank) {
    if (static_cast<size_t>(rank) < p.rank_log_bytes.size() && fs::exists(path_)) {
      fs::resize_file(path_, static_cast<uintmax_t>(p.rank_log_bytes[static_cast<size_t>(rank)]));
      open();
    } else {
      start();  // a run from before rank logs
    }
  }
  void step(const std::string& mode, const StepRecord& r) {
    log_ << mode << "," << r.step << "," << (r.found_inf_here ? 1 : 0) << ","
         << (r.skipped_here ? 1 : 0) << "," << r.scale << "," << r.loss << "\n";
  }
  int64_t flush() {
    log_.flush();
    if (!log_) {
      throw std::runtime_error("cannot write " + path_.string());
    }
    return static_cast<int64_t>(fs::file_size(path_));
  }

 private:
  void open() {
    log_.open(path_, std::ios::app);
    log_ << std::setprecision(9);
    if (!log_) {
      throw std::runtime_error("cannot open " + path_.string());
    }
  }
  fs::path path_;
  std::ofstream log_;
};

void print_table(std::ostream& os, const std::vector<ModeSummary>& results) {
  os << "\n| mode | final train loss | test accuracy | skipped steps | final scale "
        "| fp16-flushed act. grads | fp16-subnormal act. grads | optimizer step | training step "
        "| wall time | bytes/param | peak RSS |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    char row[512];
    std::snprintf(row, sizeof row,
                  "| %s | %.4f | %.2f%% | %lld | %g | %s | %s | %.3f ms | %.3f ms | %.1f s | %.1f "
                  "| %.0f MB |\n",
                  r.mode.c_str(), r.final_loss, 100.0 * r.test_accuracy,
                  static_cast<long long>(r.skipped), r.final_scale, percent(r.underflow).c_str(),
                  percent(r.subnormal).c_str(), r.step_ms, r.train_step_ms, r.seconds,
                  r.bytes_per_param, r.peak_rss_mb);
    os << row;
  }
}

// Plots from metrics.csv's rows: gnuplot data blocks per mode ('index').
bool plot(const fs::path& out, const Config& config,
          const std::vector<std::vector<std::string>>& rows,
          const std::vector<ModeSummary>& results) {
  if (!torchamp_apps::have_gnuplot()) {
    return false;
  }
  const Task& task = find_task(config.task);
  const std::vector<std::string> layers = activation_names(task);
  const fs::path steps_data = out / "plot-steps.txt", epochs_data = out / "plot-epochs.txt";
  {
    std::ofstream steps(steps_data), epochs(epochs_data);
    for (const auto& r : results) {
      steps << "# " << r.mode << "\n";
      epochs << "# " << r.mode << "\n";
      std::string skipped_before = "0";
      for (const auto& v : rows) {
        if (v.size() < 9 + layers.size() || v[1] != r.mode) {
          continue;
        }
        // step loss scale underflow skipped-here layers...
        steps << v[0] << " " << v[2] << " " << v[3] << " " << v[5] << " "
              << (v[4] != skipped_before ? "1" : "0");
        for (size_t l = 0; l < layers.size(); ++l) {
          steps << " " << v[9 + l];
        }
        steps << "\n";
        skipped_before = v[4];
        if (!v[8].empty()) {
          epochs << std::stoi(v[7]) + 1 << " " << v[8] << "\n";
        }
      }
      steps << "\n\n";
      epochs << "\n\n";
    }
  }
  const std::string d = "'" + steps_data.string() + "'", e = "'" + epochs_data.string() + "'";
  std::ostringstream script;
  // One line per mode from `data`'s blocks, `column` its y values.
  auto each_mode = [&](const std::string& data, const std::string& column) {
    for (size_t i = 0; i < results.size(); ++i) {
      script << (i ? ", " : "") << data << " index " << i << " using 1:" << column
             << " with lines lw 1.5 title '" << results[i].mode << "' noenhanced";
    }
  };
  script << "set terminal pngcairo size 1000,560 font 'sans,11'\n"
         << "set grid\nset key top right\nset xlabel 'step'\n"
         << "set output '" << (out / "loss.png").string() << "'\n"
         << "set title 'Training loss per step (" << task.name << ": " << task.summary.substr(0, 40)
         << "...)' noenhanced\n"
         << "set ylabel 'cross-entropy (batch)'\nset logscale y\nplot ";
  each_mode(d, "2");
  script << "\nset output '" << (out / "scale.png").string() << "'\n"
         << "set title 'Loss scale per step (the sawtooth); crosses: skipped steps'\n"
         << "set ylabel 'scale'\nset logscale y 2\nset format y '2^{%L}'\nplot ";
  bool any = false;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].scaled) {
      script << (any ? ", " : "") << d << " index " << i << " using 1:3 with steps lw 1.5 lc "
             << i + 1 << " title '" << results[i].mode << "' noenhanced, " << d << " index " << i
             << " using 1:($5 > 0 ? $3 : NaN) with points pt 2 ps 1.5 lc " << i + 1 << " notitle";
      any = true;
    }
  }
  if (!any) {
    script << "0 notitle";
  }
  script << "\nset output '" << (out / "accuracy.png").string() << "'\n"
         << "set title 'Test accuracy after each epoch'\nset xlabel 'epoch'\n"
         << "set ylabel 'test accuracy'\nunset logscale y\nset format y '%.0f%%'\n"
         << "set key bottom right\nplot ";
  each_mode(e, "($2*100)");
  script << "\nset output '" << (out / "underflow.png").string() << "'\n"
         << "set title 'Activation-gradient entries that are zero in float16 (fp32/bf16: would "
            "be)'\nset xlabel 'step'\nset key top right\n"
         << "set ylabel 'share of all entries'\nplot ";
  each_mode(d, "($4*100)");
  // Per layer, for the float16 modes.
  script << "\nset output '" << (out / "underflow-layers.png").string() << "'\n"
         << "set title 'Per activation: entries of its gradient zero in float16 (solid: fp16, "
            "dashed: fp16+scaler)'\nset key outside right\nplot ";
  any = false;
  for (size_t i = 0; i < results.size(); ++i) {
    const bool scaled = results[i].mode == "fp16+scaler";
    if (results[i].mode != "fp16" && !scaled) {
      continue;
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      script << (any ? ", " : "") << d << " index " << i << " using 1:($" << 6 + l
             << "*100) with lines lw 1.2 lc " << l + 1 << (scaled ? " dt 2" : "") << " title '"
             << layers[l] << (scaled ? " (scaled)" : "") << "' noenhanced";
      any = true;
    }
  }
  if (!any) {
    script << "0 notitle";
  }
  script << "\n";
  const fs::path gp = out / "plots.gp";
  std::ofstream(gp) << script.str();
  const bool ok = torchamp_apps::run_gnuplot(gp.string());
  fs::remove(steps_data);
  fs::remove(epochs_data);
  return ok;
}

std::string task_help() {
  std::string s = "Workload:";
  for (const auto& t : tasks()) {
    s += "\n  " + t.name + (&t == &tasks().front() ? " (default)" : "") + ": " + t.summary;
  }
  return s;
}

// A bad option or an impossible run: the message, exit 2, nothing written.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The command line.
struct Args {
  Config config;
  std::string out_dir, resume_dir;
  int64_t checkpoint_every = 0;
  std::string parallel_mode = "data";
  double timeout_s = 300;
  bool lr_given = false, modes_given = false;
  std::set<std::string> given;  // the Config keys (config.txt's) given on the command line
};

// Parses argv into `a`; returns -1 to go on, else the exit code.
int parse(int argc, char** argv, Args& a) {
  CLI::App app{
      "torchamp-train: mixed-precision training on the UCI handwritten digits, once per "
      "precision mode, comparing float32, float16 without and with loss scaling, and bfloat16."};
  Config& config = a.config;
  config.data = default_data_path();
  config.modes = default_modes();
  int64_t seed = 0;
  std::vector<std::string> task_names;
  for (const auto& t : tasks()) {
    task_names.push_back(t.name);
  }
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
  auto* out_opt = app.add_option(
      "--out", a.out_dir,
      "Output folder (default runs/<date-time>/). A folder that holds a run of the same options "
      "continues it from its last checkpoint (torchrun --max-restarts restarts the same command "
      "line); one of other options is an error");
  app.add_option("--resume", a.resume_dir,
                 "Continue the run in this folder from its last checkpoint (instead of --out; "
                 "options given must match the run's)")
      ->excludes(out_opt);
  app.add_option("--checkpoint-every", a.checkpoint_every,
                 "Write a checkpoint (model, optimizer, scaler) every N steps into the run folder "
                 "(0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--init-scale", config.init_scale, "GradScaler initial scale")
      ->check(CLI::PositiveNumber)
      ->check(CLI::Range(1e-38, 3.4e38))
      ->capture_default_str();
  app.add_option("--growth-interval", config.growth_interval,
                 "GradScaler growth interval (clean steps before the scale doubles)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_flag("--deterministic,!--nondeterministic", config.deterministic,
               "Run MKL (the BLAS of the pip wheels' LibTorch) on one thread, so that the same "
               "command writes the same numbers every run (default). --nondeterministic: MKL's "
               "default threads; float32 matmuls then differ in the last bits from run to run "
               "on some machines");
  app.add_option("--data", config.data, "CSV (optionally .gz): 64 pixel columns 0..16, then label")
      ->capture_default_str();
  app.add_option("--parallel", a.parallel_mode,
                 "Under torchrun (WORLD_SIZE > 1): data (each rank a slice of every batch, "
                 "gradients all-reduced) or sharded (each rank steps its shard of the parameters "
                 "and optimizer state; the scaler agrees on overflow over the group). "
                 "--batch-size stays the global batch")
      ->check(CLI::IsMember({"data", "sharded"}))
      ->capture_default_str();
  app.add_option("--timeout", a.timeout_s,
                 "Seconds any collective may wait for the other ranks before this one fails")
      ->check(CLI::Range(1.0, 86400.0))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
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
void complete(Config& config, const Args& a, const LaunchEnv& env) {
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
  const Options saved = folder.read_config();
  for (const auto& [key, value] : a.config.to_map()) {
    const auto it = saved.find(key);
    if (a.given.count(key) > 0 && (it == saved.end() || it->second != value)) {
      throw UsageError("--resume: --" + key + " is " + value + " here but " +
                       (it == saved.end() ? std::string("absent") : it->second) + " in " +
                       a.resume_dir + "/config.txt");
    }
  }
  Config config = Config::from_map(saved);
  // The checkpoint holds one optimizer shard per rank of the run.
  if (config.world_size != world) {
    throw UsageError("--resume: the run in " + a.resume_dir + " ran on " +
                     std::to_string(config.world_size) +
                     " process(es) (world-size in its config.txt), this one on " +
                     std::to_string(world) + ": resume with the same number");
  }
  return config;
}

// --out on a run folder: every setting must be the run's (another one would
// mix two runs).
void check_same_run(const RunFolder& folder, const fs::path& run_dir, const Config& config) {
  // Both ways; a key one lacks reads as unset.
  if (const auto d = torchamp_apps::differing_option(folder.read_config(), config.to_map(), "")) {
    throw UsageError("--out: " + run_dir.string() + " holds a run whose --" + d->key + " is " +
                     (d->a.empty() ? "unset" : d->a) + ", but this one's is " +
                     (d->b.empty() ? "unset" : d->b) +
                     ": give its options to continue it, or another --out");
  }
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
                  const Dataset& train, const Dataset& test, const std::string& resume_line,
                  bool continuing, bool mkl_pinned) {
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
  std::cout << resume_line << "LibTorch " << TORCH_VERSION << ": the fp16 modes "
            << (cpu_fp16_autocast() ? "run under CPU float16 autocast (matmuls in float16)"
                                    : "store activations in float16 between layers (no CPU "
                                      "float16 autocast before LibTorch 2.2)")
            << "\n"
            << (!config.deterministic
                    ? "nondeterministic: MKL (where the LibTorch has it) on its default "
                      "threads; float32 matmuls may differ from run to run"
                : mkl_pinned
                    ? "deterministic: MKL's float32 matmuls on one thread, so the same command "
                      "writes the same numbers every run (--nondeterministic: MKL's threads)"
                    : "deterministic: this LibTorch has no MKL; its BLAS and kernels give the "
                      "same numbers every run")
            << std::endl;  // before anything can kill the process
}

// Trains the modes from `position` on, every rank; rank 0 writes the logs,
// the checkpoints and the progress.
void train_modes(const Config& config, const Dataset& train, const Dataset& test, RunFolder& folder,
                 RankLog& rank_log, const Parallel& parallel, const Position& position,
                 const std::string& resume_from, int64_t checkpoint_every) {
  const bool root = parallel.rank() == 0;
  ProgressPrinter printer(isatty(STDOUT_FILENO) != 0, config.epochs);
  Hooks hooks;
  hooks.step = [&](const std::string& mode, const StepRecord& r, int64_t total) {
    rank_log.step(mode, r);
    if (root) {
      folder.step(mode, r);
      printer(mode, r, total);
    }
  };
  hooks.bookmark = [&](Position& p) {  // a collective: every rank's log size
    if (root) {
      folder.bookmark(p);
    }
    p.rank_log_bytes = parallel.all_gather(rank_log.flush());
  };
  hooks.checkpoint_every = checkpoint_every;
  hooks.checkpoint_path = folder.checkpoint();
  for (auto i = position.mode_index; i < static_cast<int64_t>(config.modes.size()); ++i) {
    const ModeSummary done = train_mode(i, train, test, config, hooks,
                                        i == position.mode_index ? resume_from : "", parallel);
    // Always (it is small): a resumed run never repeats a finished mode.
    Position next{i + 1, 0, 0, 0, {}};
    if (root) {
      folder.finished(done);
    }
    hooks.bookmark(next);
    if (root) {
      save_position(folder.checkpoint(), next);
    }
  }
}

// The table and the plots of a run folder's finished modes.
void report(RunFolder& folder, const Config& config) {
  const std::vector<ModeSummary> results = folder.summaries();
  print_table(std::cout, results);
  std::cout << "\nwrote " << folder.path("metrics.csv").string() << " and summary.csv\n";
  if (plot(folder.path(""), config, folder.metrics(), results)) {
    std::cout << "wrote loss.png, scale.png, accuracy.png, underflow.png and "
                 "underflow-layers.png there\n";
  } else {
    std::cout << "gnuplot not found (Debian: apt-get install gnuplot-nox): no plots, the CSV "
                 "has everything\n";
  }
}

Parallel form_group(const LaunchEnv& env, const Config& config, double timeout_s,
                    const GroupMaker& make_group) {
  if (env.world <= 1) {
    return Parallel();
  }
  try {
    return make_group(env, config.parallel,
                      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  } catch (const std::invalid_argument& e) {  // the launch environment
    throw UsageError(std::string("error: ") + e.what());
  }
}

// The run after the command line: its folder (new, or one to continue), the
// checks, the group, the modes and the report.
int train(Args& a, const LaunchEnv& env, const GroupMaker& make_group) {
  const bool resume_given = !a.resume_dir.empty();
  // Every rank knows the same folder: without --out, rank 0's clock names
  // it (all ranks start within a second, but need not agree on which).
  if (!resume_given && a.out_dir.empty() && env.world > 1) {
    throw UsageError("error: on more than one process give --out (or --resume)");
  }
  const fs::path run_dir = resume_given        ? fs::path(a.resume_dir)
                           : a.out_dir.empty() ? fs::path(torchamp_apps::timestamped("runs/"))
                                               : fs::path(a.out_dir);
  RunFolder folder(run_dir);
  // --out on a run folder: the same command line again (a torchrun restart
  // after a failure, or a user's); it continues where the run stopped.
  const bool out_has_run =
      !resume_given && !a.out_dir.empty() && fs::exists(run_dir / "config.txt");
  const bool resuming = resume_given || out_has_run;
  Config config = resume_given ? adopt_saved(a, folder, env.world) : a.config;
  const bool mkl_pinned = config.deterministic && pin_mkl_to_one_thread();
  check_runnable(config, a, env.world);
  const Dataset all = load_digits(config.data);
  const auto [train, test] = split(all, 0.2, config.seed);
  if (out_has_run) {
    check_same_run(folder, run_dir, config);
  }
  Position position;  // where a resumed run continues
  if (resuming && fs::exists(folder.checkpoint())) {
    position = read_position(folder.checkpoint());
  }
  if (resuming && position.mode_index >= static_cast<int64_t>(config.modes.size())) {
    if (env.rank == 0) {
      std::cout << "torchamp-train: the run in " << run_dir.string() << " has finished ("
                << (config.modes.size() == 1
                        ? std::string("its one mode")
                        : "all " + std::to_string(config.modes.size()) + " modes")
                << " done); nothing to do. Its results (" << folder.path("summary.csv").string()
                << "):\n";
      print_table(std::cout, folder.summaries());
    }
    return 0;
  }
  check_shares(config, env.world, train.x.size(0));
  const Parallel parallel = form_group(env, config, a.timeout_s, make_group);
  // Rank 0 sets up the folder; the others write their logs into it only
  // after (a collective is the barrier).
  const bool root = parallel.rank() == 0;  // writes the table, logs, plots and checkpoints
  const bool continuing = resuming && position.metrics_bytes > 0;
  if (root && continuing) {
    folder.resume(position);
  } else if (root) {
    folder.start(config);
    save_initial(folder.path("initial.pt").string(), config, train, test);
  }
  parallel.all_gather(0);
  RankLog rank_log(folder.path(""), parallel.rank());
  if (continuing) {
    rank_log.resume(position, parallel.rank());
  } else {
    rank_log.start();
  }
  if (root) {
    const std::string resume_line =
        continuing ? "resuming at mode " + std::to_string(position.mode_index + 1) + "/" +
                         std::to_string(config.modes.size()) + ", step " +
                         std::to_string(position.step) + "\n"
        : resuming ? "no checkpoint in " + run_dir.string() + " yet: the run starts again\n"
                   : "";
    print_banner(config, folder, parallel, train, test, resume_line, continuing, mkl_pinned);
  }
  const std::string resume_from = resuming && position.step > 0 ? folder.checkpoint() : "";
  train_modes(config, train, test, folder, rank_log, parallel, position, resume_from,
              a.checkpoint_every);
  if (root) {
    report(folder, config);
  }
  return 0;
}

}  // namespace

int torchamp_train::run(int argc, char** argv, const GroupMaker& make_group) {
  Args a;
  if (const int rc = parse(argc, argv, a); rc >= 0) {
    return rc;
  }
  LaunchEnv env;
  try {
    env = LaunchEnv::from_environment();
  } catch (const std::invalid_argument& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  if (env.world > 1 && !make_group) {
    std::cerr << "error: WORLD_SIZE=" << env.world
              << " but this torchamp-train was built without distributed support "
                 "(TORCHAMP_WITH_DISTRIBUTED=OFF), so it cannot form a process group.\n";
    return 2;
  }
  complete(a.config, a, env);
  try {
    return train(a, env, make_group);
  } catch (const UsageError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const DataError& e) {
    std::cerr << "--data: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
