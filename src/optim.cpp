#include <torchamp/optim.h>

#include "compat.h"
#include "kernels/optim_kernels.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <memory>
#include <vector>

namespace torchamp {
namespace optim {
namespace {

bool dense_cpu(const at::Tensor& t, at::ScalarType dtype) {
  return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() &&
         t.scalar_type() == dtype && t.is_contiguous();
}

// Every parameter with a gradient: dense contiguous CPU parameter, gradient
// and existing state tensors, all of one supported dtype.
template <class State, class StateTensors>
bool fusable(const torch::optim::Optimizer& opt, StateTensors state_tensors) {
  const auto& state = opt.state();
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      const auto dtype = p.scalar_type();
      if (!kernels::optim_supports(dtype) || !dense_cpu(p, dtype) || !dense_cpu(grad, dtype)) {
        return false;
      }
      auto it = state.find(compat::optim_state_key(state, p));
      if (it != state.end()) {
        for (const at::Tensor* t : state_tensors(static_cast<const State&>(*it->second))) {
          if (t->defined() && !dense_cpu(*t, dtype)) {
            return false;
          }
        }
      }
    }
  }
  return true;
}

template <class Options, class State>
void adam_fused(torch::optim::Optimizer& opt, float inv_scale, bool decoupled) {
  at::NoGradGuard no_grad;
  auto& state = opt.state();
  std::vector<kernels::AdamJob> jobs;
  for (auto& group : opt.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      auto& slot = state[compat::optim_state_key(state, p)];
      if (!slot) {  // as the base class: created at the parameter's first step
        auto fresh = std::make_unique<State>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        if (options.amsgrad()) {
          fresh->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        }
        slot = std::move(fresh);
      }
      auto& st = static_cast<State&>(*slot);
      if (options.amsgrad() && !st.max_exp_avg_sq().defined()) {
        st.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      st.step(st.step() + 1);
      const double bias_correction1 = 1 - std::pow(beta1, st.step());
      const double bias_correction2 = 1 - std::pow(beta2, st.step());
      kernels::AdamJob job;
      job.param = p.data_ptr();
      job.grad = grad.data_ptr();
      job.exp_avg = st.exp_avg().data_ptr();
      job.exp_avg_sq = st.exp_avg_sq().data_ptr();
      job.max_exp_avg_sq = options.amsgrad() ? st.max_exp_avg_sq().data_ptr() : nullptr;
      job.numel = p.numel();
      job.dtype = p.scalar_type();
      job.lr = options.lr();
      job.beta1 = beta1;
      job.beta2 = beta2;
      job.eps = options.eps();
      job.weight_decay = options.weight_decay();
      job.step_size = options.lr() / bias_correction1;
      job.bias_correction2_sqrt = std::sqrt(bias_correction2);
      job.decoupled = decoupled;
      jobs.push_back(job);
    }
  }
  kernels::adam_step_cpu(jobs, inv_scale);
}

template <class State>
std::vector<const at::Tensor*> adam_state_tensors(const State& s) {
  return {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()};
}

std::vector<const at::Tensor*> sgd_state_tensors(const torch::optim::SGDParamState& s) {
  return {&s.momentum_buffer()};
}

// As the base classes' step: the closure (if any) runs with grad mode on, the
// update without.
template <class Self, class Base>
at::Tensor fused_or_base_step(Self& self, torch::optim::Optimizer::LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  if (self.can_fuse()) {
    self.fused_step(1.0f);
  } else {
    self.Base::step(nullptr);
  }
  return loss;
}

}  // namespace

at::Tensor SGD::step(LossClosure closure) {
  return fused_or_base_step<SGD, torch::optim::SGD>(*this, std::move(closure));
}

bool SGD::can_fuse() const {
  return fusable<torch::optim::SGDParamState>(*this, sgd_state_tensors);
}

void SGD::fused_step(float inv_scale) {
  at::NoGradGuard no_grad;
  std::vector<kernels::SgdJob> jobs;
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      kernels::SgdJob job;
      job.param = p.data_ptr();
      job.grad = grad.data_ptr();
      job.momentum_buffer = nullptr;
      job.first = false;
      if (options.momentum() != 0) {
        auto& slot = state_[compat::optim_state_key(state_, p)];
        if (!slot) {
          slot = std::make_unique<torch::optim::SGDParamState>();
        }
        auto& st = static_cast<torch::optim::SGDParamState&>(*slot);
        if (!st.momentum_buffer().defined()) {
          // The base class clones the first direction into the buffer.
          st.momentum_buffer(at::empty_like(p, at::MemoryFormat::Contiguous));
          job.first = true;
        }
        job.momentum_buffer = st.momentum_buffer().data_ptr();
      }
      job.numel = p.numel();
      job.dtype = p.scalar_type();
      job.lr = options.lr();
      job.momentum = options.momentum();
      job.dampening = options.dampening();
      job.weight_decay = options.weight_decay();
      job.nesterov = options.nesterov();
      jobs.push_back(job);
    }
  }
  kernels::sgd_step_cpu(jobs, inv_scale);
}

at::Tensor Adam::step(LossClosure closure) {
  return fused_or_base_step<Adam, torch::optim::Adam>(*this, std::move(closure));
}

bool Adam::can_fuse() const {
  return fusable<torch::optim::AdamParamState>(*this,
                                               adam_state_tensors<torch::optim::AdamParamState>);
}

void Adam::fused_step(float inv_scale) {
  adam_fused<torch::optim::AdamOptions, torch::optim::AdamParamState>(*this, inv_scale, false);
}

at::Tensor AdamW::step(LossClosure closure) {
  return fused_or_base_step<AdamW, torch::optim::AdamW>(*this, std::move(closure));
}

bool AdamW::can_fuse() const {
  return fusable<torch::optim::AdamWParamState>(*this,
                                                adam_state_tensors<torch::optim::AdamWParamState>);
}

void AdamW::fused_step(float inv_scale) {
  adam_fused<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(*this, inv_scale, true);
}

}  // namespace optim
}  // namespace torchamp
