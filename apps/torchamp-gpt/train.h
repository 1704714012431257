#pragma once

// torchamp-gpt's training: one run per precision mode, from the same initial
// weights over the same batches, each resumable from a checkpoint.

#include "corpus.h"
#include "model.h"
#include "run_state.h"
#include "support.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
}

namespace torchamp_gpt {

/// A precision mode: where it runs, what autocast does, what the parameters
/// are stored in, and whether a GradScaler, master weights or stochastic
/// rounding take part.
struct Mode {
  std::string name;
  c10::DeviceType device;
  std::optional<c10::ScalarType> autocast;  // the forward's autocast dtype
  c10::ScalarType params;                   // the parameters' own dtype
  bool scaler;                              // torchamp::GradScaler on the loss
  bool masters;                             // float32 master weights in the optimizer
  bool stochastic;                          // the optimizer rounds stochastically (no masters)
  std::string summary;
  bool by_default = true;  // run when --modes is not given (where available)
  bool graph = false;      // the step captured in a CUDA graph and replayed (--cuda-graph)
};

/// Every mode the program knows; those this LibTorch and machine run; the
/// one named (std::invalid_argument otherwise); those run by default.
const std::vector<Mode>& known_modes();
bool mode_available(const Mode& mode);
const Mode& find_mode(const std::string& name);
std::vector<std::string> default_modes();
/// --cuda-graph: each CUDA mode of `modes` followed by its captured twin
/// ("<mode>+graph"); std::invalid_argument when `modes` has no CUDA mode.
std::vector<std::string> with_graph_modes(const std::vector<std::string>& modes);

/// Whether this LibTorch runs --device-step (ATen's CPU fused AdamW: 2.4 and
/// newer); else why not.
std::optional<std::string> device_step_unsupported();

/// Everything that decides a run's numbers (what --out's options.txt holds).
struct Config {
  GPTConfig model;
  int64_t vocab = 0;  // --vocab: embedding rows (0: the corpus's characters)
  int64_t batch_size = 8;
  int64_t accum = 1;  // micro-batches per step (each rank)
  int64_t steps = 100;
  int64_t warmup = 10;
  int64_t eval_every = 50;
  int64_t eval_batches = 4;
  double lr = 1e-3;
  double min_lr = 1e-4;
  double weight_decay = 0.1;
  double clip = 1.0;
  double init_scale = 65536.0;
  int64_t growth_interval = 2000;
  uint64_t seed = 0;
  std::string data;
  std::vector<std::string> modes;
  bool deterministic = true;  // MKL on one thread (same bits every run)
  int world = 1;              // ranks under torchrun
  // --device-step: the CPU modes take the CUDA modes' step (no host read):
  // the scaler's state in tensors, ATen's fused AdamW, the rate a tensor.
  bool device_step = false;

  torchamp_apps::Options to_options() const;
};

// App support (apps/common/run_state.h): where a run stands.
using torchamp_apps::Position;

/// One optimizer step as metrics.csv records it (no times: the file of a
/// resumed run equals the uninterrupted one's byte for byte).
struct StepRow {
  std::string mode;
  int64_t step;
  double loss;      // mean over the global batch (unscaled)
  double val_loss;  // NaN except every eval_every steps and at the end
  double scale;     // after update(); 1 without a scaler
  int64_t skipped;  // 1: the scaler skipped this step (metrics.csv: the count so far)
  double lr;
  double seconds = 0;  // the step's wall time (the progress line's; not in metrics.csv)
};

/// What summary.csv and the table show of one finished mode.
struct ModeResult {
  std::string mode;
  double val_loss = 0;
  double train_loss = 0;  // the last step's
  int64_t skipped = 0;
  double final_scale = 1;
  double tokens_per_s = 0;  // over the whole group, over the steps this process ran
  double step_ms = 0;
  double peak_rss_mb = 0;   // this process's, during the mode
  double start_rss_mb = 0;  // its resident memory as the mode began
  double bytes_per_param = 0;
  int64_t params = 0;
  std::string weights;  // FNV-1a of the final parameters' bytes
  std::string sample;   // text the trained model wrote
};

/// What the loop reports and asks for (step: every rank; rank 0 writes),
/// with the process group (null on one process).
struct Runtime : torchamp_apps::Hooks<StepRow> {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  int rank = 0;
  int64_t sample_chars = 0;  // text the trained model writes at the end (rank 0)
  // --profile: each mode's last `profile_steps` steps under LibTorch's
  // profiler (rank 0), not counted in tokens/s; the trace to
  // `trace_dir`/trace-<mode>.json.
  int64_t profile_steps = 0;
  std::string trace_dir;
};

/// The initial weights every mode starts from (seeded), for the Python twin:
/// a torch::pickle_save'd dict of name -> tensor.
GPT initial_model(const Config& config, int64_t vocab);
void save_initial(const std::string& path, const Config& config, int64_t vocab);

/// Trains mode `config.modes[mode_index]`, from `resume` (its checkpoint
/// holds a position inside this mode) or from the start.
ModeResult train_mode(const Corpus& corpus, const Config& config, int64_t mode_index,
                      const Runtime& runtime, const std::string& resume);

}  // namespace torchamp_gpt
