#pragma once

// torchamp-gpt's --profile: LibTorch's profiler (Kineto) over a mode's last
// steps, each step marked "step", saved as a Chrome trace (chrome://tracing,
// ui.perfetto.dev). gpt_python.py --profile writes the same of the Python
// twin's steps; profile_report.py reads both and says where the time goes.

#include <ATen/record_function.h>

#include <memory>
#include <string>

namespace torchamp_gpt {

/// The profiler, on from construction (CPU operators; with `cuda` also the
/// CUDA runtime's calls and the kernels) to save().
class StepProfiler {
 public:
  explicit StepProfiler(bool cuda);
  ~StepProfiler();  // stops without saving where save() was not reached
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  /// Runs `body` as one step (the trace's user annotation "step").
  template <typename Body>
  auto step(const Body& body) {
    RECORD_USER_SCOPE("step");
    return body();
  }

  /// Stops the profiler and writes its trace to `path` (JSON).
  void save(const std::string& path);

 private:
  bool on_ = false;
};

}  // namespace torchamp_gpt
