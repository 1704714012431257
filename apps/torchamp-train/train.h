#pragma once

// The training runs of torchamp-train: one per precision mode, on the same
// split, seed, initial weights and batch order, each resumable from a
// checkpoint.

#include "data.h"
#include "parallel.h"
#include "support.h"

#include "run_state.h"

#include <c10/core/ScalarType.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torchamp_train {

/// A workload: the network and the optimizer settings it trains with unless
/// the command line says otherwise.
struct Task {
  std::string name;
  std::string summary;  // one line, for --help and the banner
  int hidden_layers;
  int64_t width;
  std::string activation;  // "sigmoid" or "tanh"
  std::string optimizer;   // "sgd", "adam" or "adamw"
  double lr;
  int epochs;
  int batch_size;
  bool cosine;  // the learning rate decays to 0 along a cosine over the run
};

/// The tasks, the default first.
const std::vector<Task>& tasks();
/// The task of that name; throws std::invalid_argument naming it otherwise.
const Task& find_task(const std::string& name);

struct Config {
  std::string task = "deep";
  int epochs = 0;
  int batch_size = 0;
  double lr = 0;
  uint64_t seed = 0;
  double init_scale = 65536.0;
  int64_t growth_interval = 50;    // short, so the sawtooth shows in a short run
  std::string optimizer;           // "sgd" (momentum 0.9), "adam" or "adamw" (weight decay 1e-4)
  bool fused = false;              // torchamp::optim's fused optimizer instead of LibTorch's
  bool checkpoint_layers = false;  // recompute each hidden layer in backward (torchamp::checkpoint)
  std::vector<std::string> modes;
  std::string data;
  std::string parallel = "none";  // "data" or "sharded" on more than one process
  int world_size = 1;             // processes (torchrun's WORLD_SIZE)
  // MKL's calls on one thread, so that the same command writes the same
  // numbers every time (MKL's multi-threaded SGEMM is not run-to-run
  // reproducible; see docs/demo.md); false: MKL's default threads.
  bool deterministic = true;

  /// The settings as key=value pairs (what a run folder's options.txt holds
  /// and what --resume compares), and back.
  std::map<std::string, std::string> to_map() const;
  static Config from_map(const std::map<std::string, std::string>& kv);
};

/// One optimizer step of one mode.
struct StepRow {
  int64_t step;
  int epoch;
  double loss;           // the batch's (unscaled) loss
  double scale;          // the scale after update(); 1 without a scaler
  int64_t skipped;       // steps skipped so far
  double underflow;      // of this step's activation-gradient entries: zero in float16
  double subnormal;      // ... and subnormal in float16
  double test_accuracy;  // after the epoch's last step; NaN on other steps
  std::vector<double> layer_underflow;  // `underflow` per activation, input side first
  bool skipped_here = false;            // the scaler skipped this step
  bool found_inf_here = false;          // this rank's own gradients held an inf/NaN
  std::string mode;                     // the mode's name
  int64_t total = 0;                    // the mode's steps
};

/// What the table shows of one finished mode.
struct ModeResult {
  std::string mode;
  bool scaled = false;
  double final_loss = 0;     // cross-entropy over the training set, float32 forward
  double test_accuracy = 0;  // on the held-out set, float32 forward
  int64_t skipped = 0;
  double final_scale = 1;
  double underflow = 0;  // over the whole run
  double subnormal = 0;
  double seconds = 0;  // wall time of the mode (over all processes that ran it)
  double step_ms = 0;  // mean time of the optimizer step (scaler.step: unscale, check, update)
  double train_step_ms = 0;  // mean time of a whole training step (forward to update)
  double bytes_per_param =
      0;                   // parameters + gradients + optimizer state (this rank's), per element
  double peak_rss_mb = 0;  // the process's peak resident memory during the mode
};

// App support (apps/common/support.h), used here unqualified.
using torchamp_apps::bytes_per_param;
using torchamp_apps::peak_rss_mb;
using torchamp_apps::pin_mkl_to_one_thread;
using torchamp_apps::reset_peak_rss;

/// A precision mode: what the forward runs in, what the parameters are, and
/// whether a GradScaler and master weights take part.
struct Mode {
  std::string name;
  bool cuda;               // on the GPU, under CUDA float16 autocast
  bool fp16;               // CPU float16: autocast where LibTorch has it, else float16 storage
  bool bf16;               // CPU bfloat16 autocast
  c10::ScalarType params;  // the parameters' own dtype
  bool masters;            // float32 master weights (torchamp's fused optimizer)
  bool scaler;             // a GradScaler on the loss
  bool by_default;         // trained without --modes (where available)
};

/// Every mode, in the order of the table; the one named (throws
/// std::invalid_argument naming it otherwise).
const std::vector<Mode>& modes();
const Mode& find_mode(const std::string& name);

/// Whether the fp16 modes run under real CPU float16 autocast (LibTorch >=
/// 2.2); otherwise they store activations in float16 between layers.
bool cpu_fp16_autocast();

/// The dtype a CPU mode's forward autocasts to, its matmuls' dtype: bfloat16
/// for bf16+scaler, float16 for the fp16 modes under real float16 autocast;
/// none for the others (float32 arithmetic: fp32, the <dtype>-params modes,
/// fp16 before LibTorch 2.2) and the CUDA mode.
std::optional<at::ScalarType> cpu_autocast_dtype(const Mode& mode);

/// Every mode this build and machine run: the CPU ones (the default ones and
/// the <dtype>-params modes), and cuda-fp16+scaler where the linked LibTorch
/// has CUDA and a GPU is present.
std::vector<std::string> available_modes();
/// The modes a run without --modes trains: the available ones but the
/// <dtype>-params modes.
std::vector<std::string> default_modes();
/// All mode names the program knows, available here or not.
std::vector<std::string> known_modes();

/// The names of the measured activations of a task's network ("fc0", ...,
/// "out"): metrics.csv's per-layer underflow columns.
std::vector<std::string> activation_names(const Task& task);

// App support (apps/common/run_state.h): where a run stands.
using torchamp_apps::Position;

/// What train_mode reports and asks for along the way.
using Hooks = torchamp_apps::Hooks<StepRow>;

/// The initial weights (the same in every mode) and the split, for the
/// Python comparison: a torch::pickle_save'd dict that Python's torch.load
/// reads.
void save_initial(const std::string& path, const Config& config, const Dataset& train,
                  const Dataset& test);

/// Trains mode `config.modes[mode_index]`; from the checkpoint at
/// `resume_from` when that is non-empty and holds a position inside this
/// mode (its model, optimizer, scaler and counters), else from the start.
/// On more than one process every rank calls it (the hooks too: a bookmark
/// is a collective); rank 0 alone writes checkpoints.
ModeResult train_mode(int64_t mode_index, const Dataset& train, const Dataset& test,
                      const Config& config, const Hooks& hooks, const std::string& resume_from,
                      const Parallel& parallel);

}  // namespace torchamp_train
