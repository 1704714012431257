#pragma once

// torchamp-gpt's --cuda-graph: a training step captured once in a CUDA graph
// and replayed, behind an interface with no CUDA type, so that the program
// builds against every LibTorch (step_graph.cpp holds the CUDA code, compiled
// where LibTorch is a CUDA build).

#include <functional>
#include <memory>

namespace torchamp_gpt {

/// Runs a step's body: eagerly while `capture` is false; else eagerly the
/// first `warmup` times (the optimizer makes its state, cuBLAS its handles),
/// then it captures the body once and from then on replays the capture. A
/// capturing StepGraph makes a side stream current while it lives (capture
/// needs one), for its eager steps too; the stream waits for the work queued
/// before and is waited for after. `capture` on a LibTorch without CUDA
/// throws std::invalid_argument.
class StepGraph {
 public:
  explicit StepGraph(bool capture, int warmup = 3);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  void run(const std::function<void()>& body);
  /// Whether the body has been captured (the steps from now on replay it).
  bool captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torchamp_gpt
