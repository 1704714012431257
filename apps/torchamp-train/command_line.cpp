#include "command_line.h"

#include "cli.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace torchamp_train {
namespace {

using torchamp_apps::Options;
using torchamp_apps::RunFolder;

std::string task_help() {
  std::string s = "Workload:";
  for (const auto& t : tasks()) {
    s += "\n  " + t.name + (&t == &tasks().front() ? " (default)" : "") + ": " + t.summary;
  }
  return s;
}

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

}  // namespace

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

namespace {

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

// The modes this LibTorch and machine run (on several processes, the CUDA
// mode only where asked for, and then refused; else it is dropped).
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

}  // namespace

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

}  // namespace torchamp_train
