#pragma once

// The fused updates: SGD's, and Adam's (AdamW's with decoupled weight
// decay), over what the step's walk prepared. Private to src/optim/.

#include "optim/rounding.h"
#include "optim/step_cache.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <unordered_map>
#include <vector>

namespace torchamp {
namespace optim {

template <class State>
inline StateTensors adam_tensors(const State& s) {
  return {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()};
}

// A fused optimizer's private state (torchamp/optim.h's FusedState).
struct detail::FusedState::Impl {
  explicit Impl(const FusedOptions& options)
      : masters(options.master_weights()),
        rounding{options.stochastic_rounding(), options.seed(), 0, at::Tensor(), false, {}},
        float_state(options.state_dtype() == at::kFloat),
        aten_on_cpu(options.aten_kernels()) {}
  StepCache cache;
  MasterWeights masters;
  StochasticRounding rounding;
  bool float_state;  // FusedOptions().state_dtype(kFloat)
  bool aten_on_cpu;  // FusedOptions().aten_kernels
  StepRules rules() const { return {masters.on(), rounding.on, float_state, aten_on_cpu}; }
  bool dtypes_checked = false;  // for the slow-CPU warning, at the first step
  // The step counts of Adam's parameters on ATen's path: float32 0-dim
  // tensors on the parameter's device, as ATen's ops and Python's fused
  // optimizers keep them (made from the state's count; with a device
  // scaler's flag only they know whether a step was skipped).
  struct DeviceStep {
    const torch::optim::OptimizerParamState* state;  // made for this state
    at::Tensor step;
  };
  std::unordered_map<const c10::TensorImpl*, DeviceStep> device_steps;
  std::vector<at::Tensor> lr_tensors;  // Fused::lr_tensor's, by group (undefined: options().lr())
};

// Brings the states' step counts up to the device counts (one read back
// each), which are the counts on ATen's path: a device scaler's skips and a
// CUDA graph's replays leave the states' behind.
void sync_host_steps(torch::optim::Optimizer& opt, detail::FusedState::Impl& f);

inline StateTensors sgd_tensors(const torch::optim::SGDParamState& s) {
  static const at::Tensor none;
  return {&s.momentum_buffer(), &none, &none};
}

// How many elements one ATen fused call takes at most (with the flat
// buffers of master weights and stochastic rounding; a larger tensor is a
// call alone): 2^24 unless a test sets another. Not thread-safe.
int64_t call_elements();
void set_call_elements(int64_t elements);

// Each counts an update in `f.rounding` (when on) unless the step is skipped.
void sgd_update(torch::optim::SGD& opt, detail::FusedState::Impl& f, const AmpStepArgs& args);
void adam_update(torch::optim::Adam& opt, detail::FusedState::Impl& f, const AmpStepArgs& args);
void adamw_update(torch::optim::AdamW& opt, detail::FusedState::Impl& f, const AmpStepArgs& args);

}  // namespace optim
}  // namespace torchamp
