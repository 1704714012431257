#include "step_graph.h"

#include <stdexcept>

#if TORCHAMP_GPT_CUDA_GRAPH
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>
#endif

namespace torchamp_gpt {

#if TORCHAMP_GPT_CUDA_GRAPH

struct StepGraph::Impl {
  int warmup;
  int calls = 0;
  c10::cuda::CUDAStream before = c10::cuda::getCurrentCUDAStream();
  c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  at::cuda::CUDAGraph graph;
  bool captured = false;

  explicit Impl(int warmup_) : warmup(warmup_) {
    c10::Event queued(c10::DeviceType::CUDA);  // the side stream starts after what is queued
    queued.record(before.unwrap());
    queued.block(stream.unwrap());
    guard.emplace(stream);
  }
  ~Impl() {
    guard.reset();
    try {  // (a destructor: a CUDA error here, as after a failed capture, must not escape)
      c10::Event done(c10::DeviceType::CUDA);  // the stream before waits for the side stream
      done.record(stream.unwrap());
      done.block(before.unwrap());
    } catch (...) {
    }
  }
};

StepGraph::StepGraph(bool capture, int warmup)
    : impl_(capture ? std::make_unique<Impl>(warmup) : nullptr) {}

void StepGraph::run(const std::function<void()>& body) {
  if (!impl_ || impl_->calls++ < impl_->warmup) {
    body();
    return;
  }
  if (!impl_->captured) {
    impl_->graph.capture_begin();
    try {
      body();
    } catch (...) {
      // The capture ends with the step's own error (a refusal, or a sync
      // that invalidated it), not with the error of ending it.
      try {
        impl_->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    impl_->graph.capture_end();
    impl_->captured = true;
  }
  impl_->graph.replay();
}

#else

struct StepGraph::Impl {};

StepGraph::StepGraph(bool capture, int /*warmup*/) {
  if (capture) {
    throw std::invalid_argument("--cuda-graph needs a CUDA build of LibTorch");
  }
}

void StepGraph::run(const std::function<void()>& body) {
  body();
}

#endif

StepGraph::~StepGraph() = default;

bool StepGraph::captured() const {
#if TORCHAMP_GPT_CUDA_GRAPH
  return impl_ && impl_->captured;
#else
  return false;
#endif
}

}  // namespace torchamp_gpt
