#pragma once

// The training runs of torchamp-train: one per precision mode, on the same
// split, seed and initial weights.

#include "data.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torchamp_train {

struct Config {
  int epochs = 30;
  int batch_size = 64;
  double lr = 0.05;
  uint64_t seed = 0;
  double init_scale = 65536.0;
  int64_t growth_interval = 50;   // short, so the sawtooth shows in a short run
  std::string optimizer = "sgd";  // "sgd" (momentum 0.9) or "adamw"
  bool fused = false;             // torchamp::optim's fused optimizer instead of LibTorch's
};

/// One optimizer step of one mode.
struct StepRecord {
  int64_t step;
  int epoch;
  double loss;       // the batch's (unscaled) loss
  double scale;      // the scale after update(); 1 without a scaler
  int64_t skipped;   // steps skipped so far
  double underflow;  // of this step's activation-gradient entries: zero in float16
  double subnormal;  // ... and subnormal in float16
};

struct ModeResult {
  std::string mode;
  bool scaled = false;
  std::vector<StepRecord> steps;
  double final_loss = 0;     // cross-entropy over the training set, float32 forward
  double test_accuracy = 0;  // on the held-out set, float32 forward
  int64_t skipped = 0;
  double final_scale = 1;
  double underflow = 0;  // over the whole run
  double subnormal = 0;
  double seconds = 0;
  double step_ms = 0;  // mean time of the optimizer step (scaler.step: unscale, check, update)
};

/// Whether the fp16 modes run under real CPU float16 autocast (LibTorch >=
/// 2.2); otherwise they store activations in float16 between layers.
bool cpu_fp16_autocast();

/// Called after every step: (mode, record, total steps).
using Progress = std::function<void(const std::string&, const StepRecord&, int64_t)>;

/// "fp32", "fp16", "fp16+scaler", "bf16+scaler", and "cuda-fp16+scaler" when
/// the linked LibTorch has CUDA and a GPU is present.
std::vector<std::string> available_modes();
/// All mode names the program knows, available here or not.
std::vector<std::string> known_modes();

ModeResult train_mode(const std::string& mode, const Dataset& train, const Dataset& test,
                      const Config& config, const Progress& progress);

}  // namespace torchamp_train
