#pragma once

// The fused updates: SGD's, and Adam's (AdamW's with decoupled weight
// decay), over what the step's walk prepared. Private to src/optim/.

#include "optim/rounding.h"
#include "optim/step_cache.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace torchamp {
namespace optim {

template <class State>
inline StateTensors adam_tensors(const State& s) {
  return {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()};
}

inline StateTensors sgd_tensors(const torch::optim::SGDParamState& s) {
  static const at::Tensor none;
  return {&s.momentum_buffer(), &none, &none};
}

// Each counts an update in `rounding` (when on) unless the step is skipped.
void sgd_update(torch::optim::SGD& opt, const StepCache& cache, const MasterWeights& masters,
                StochasticRounding& rounding, const AmpStepArgs& args);
void adam_update(torch::optim::Adam& opt, const StepCache& cache, const MasterWeights& masters,
                 StochasticRounding& rounding, const AmpStepArgs& args);
void adamw_update(torch::optim::AdamW& opt, const StepCache& cache, const MasterWeights& masters,
                  StochasticRounding& rounding, const AmpStepArgs& args);

}  // namespace optim
}  // namespace torchamp
