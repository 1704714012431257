#include <torchamp/optim.h>

#include "compat.h"
#include "kernels/optim_kernels.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace torchamp {
namespace optim {
namespace {

bool dense_on(const at::Tensor& t, at::ScalarType dtype, c10::Device device) {
  return t.defined() && t.layout() == at::kStrided && t.device() == device &&
         t.scalar_type() == dtype && t.is_contiguous();
}

// Dense contiguous CPU parameters go to torchamp's kernels; dense contiguous
// CUDA ones to ATen's multi-tensor fused ops where this LibTorch has them.
bool fusable_param(const at::Tensor& p, const at::Tensor& grad) {
  const auto dtype = p.scalar_type();
  if (!kernels::optim_supports(dtype) || !dense_on(p, dtype, p.device()) ||
      !dense_on(grad, dtype, p.device())) {
    return false;
  }
  return p.device().is_cpu() || (compat::kAtenFusedOptimizers && p.device().is_cuda());
}

// Every parameter with a gradient: parameter, gradient and existing state
// tensors dense, contiguous, of one supported dtype, on the CPU or (with
// ATen's fused ops) one CUDA device.
template <class State, class StateTensors>
bool fusable(const torch::optim::Optimizer& opt, StateTensors state_tensors) {
  const auto& state = opt.state();
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      if (!fusable_param(p, grad)) {
        return false;
      }
      auto it = state.find(compat::optim_state_key(state, p));
      if (it != state.end()) {
        for (const at::Tensor* t : state_tensors(static_cast<const State&>(*it->second))) {
          if (t->defined() && !dense_on(*t, p.scalar_type(), p.device())) {
            return false;
          }
        }
      }
    }
  }
  return true;
}

// ATen's fused ops divide each gradient by a scale tensor on its device
// (and then write it back divided); none when the gradients are unscaled.
c10::optional<at::Tensor> grad_scale_on(c10::Device device, const AmpStepArgs& args) {
  if (!args.grad_scale) {
    return c10::nullopt;
  }
  return at::full({1}, *args.grad_scale, at::TensorOptions().dtype(at::kFloat).device(device));
}

// The kernels' grad_scale pointer: null when the gradients are unscaled.
const float* grad_scale_ptr(const AmpStepArgs& args) {
  return args.grad_scale ? &*args.grad_scale : nullptr;
}

// One 0-dim tensor per element of a contiguous 1-D tensor, sharing its
// storage. Built directly rather than by unbind(): ten thousand parameters
// would otherwise cost ten thousand dispatched view operations a step, more
// than the fused update itself.
std::vector<at::Tensor> element_views(const at::Tensor& flat) {
  std::vector<at::Tensor> views;
  views.reserve(static_cast<size_t>(flat.numel()));
  const c10::TensorImpl& impl = *flat.unsafeGetTensorImpl();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    auto view = c10::make_intrusive<c10::TensorImpl>(c10::Storage(impl.storage()), impl.key_set(),
                                                     impl.dtype());
    view->set_sizes_contiguous({});
    view->set_storage_offset(impl.storage_offset() + i);
    views.emplace_back(std::move(view));
  }
  return views;
}

// The tensors of one ATen fused call: one param group, device and dtype (and
// for SGD whether the momentum buffers are new).
using BatchKey = std::tuple<size_t, c10::DeviceIndex, at::ScalarType, bool>;

struct AdamBatch {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<float> steps;
  double lr, beta1, beta2, weight_decay, eps;
  bool amsgrad;
};

struct SgdBatch {
  std::vector<at::Tensor> params, grads, buffers;
  double lr, momentum, dampening, weight_decay;
  bool nesterov, first;
};

template <class Options, class State>
void adam_fused(torch::optim::Optimizer& opt, const AmpStepArgs& args, bool decoupled) {
  if (args.found_inf) {  // as ATen's kernels with found_inf set: nothing changes
    return;
  }
  at::NoGradGuard no_grad;
  auto& state = opt.state();
  std::vector<kernels::AdamJob> jobs;
  std::map<BatchKey, AdamBatch> batches;
  auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& group = groups[g];
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
      if (!p.device().is_cpu()) {
        AdamBatch& b = batches[{g, p.device().index(), p.scalar_type(), false}];
        if (b.params.empty()) {
          b.lr = options.lr();
          b.beta1 = beta1;
          b.beta2 = beta2;
          b.weight_decay = options.weight_decay();
          b.eps = options.eps();
          b.amsgrad = options.amsgrad();
        }
        b.params.push_back(p);
        b.grads.push_back(grad);
        b.exp_avgs.push_back(st.exp_avg());
        b.exp_avg_sqs.push_back(st.exp_avg_sq());
        if (options.amsgrad()) {
          b.max_exp_avg_sqs.push_back(st.max_exp_avg_sq());
        }
        b.steps.push_back(static_cast<float>(st.step()));
        continue;
      }
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
  kernels::adam_step_cpu(jobs, grad_scale_ptr(args));
  for (auto& [key, b] : batches) {
    const c10::Device device = b.params.front().device();
    // ATen reads each step count from a float32 tensor on the device: one
    // copy for the batch, one view per parameter.
    at::Tensor host = at::empty({static_cast<int64_t>(b.steps.size())}, at::kFloat);
    std::copy(b.steps.begin(), b.steps.end(), host.data_ptr<float>());
    const std::vector<at::Tensor> steps = element_views(host.to(device));
    compat::fused_adam(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, steps, b.lr,
                       b.beta1, b.beta2, b.weight_decay, b.eps, b.amsgrad, decoupled,
                       grad_scale_on(device, args));
  }
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
  if (self.supports_amp_scaling()) {
    self.amp_step(AmpStepArgs());
  } else {
    self.Base::step(nullptr);
  }
  return loss;
}

}  // namespace

at::Tensor SGD::step(LossClosure closure) {
  return fused_or_base_step<SGD, torch::optim::SGD>(*this, std::move(closure));
}

bool SGD::supports_amp_scaling() const {
  return fusable<torch::optim::SGDParamState>(*this, sgd_state_tensors);
}

void SGD::amp_step(const AmpStepArgs& args) {
  if (args.found_inf) {  // as ATen's kernels with found_inf set: nothing changes
    return;
  }
  at::NoGradGuard no_grad;
  std::vector<kernels::SgdJob> jobs;
  std::map<BatchKey, SgdBatch> batches;
  auto& groups = param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    auto& group = groups[g];
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    for (auto& p : group.params()) {
      const at::Tensor& grad = p.grad();
      if (!grad.defined()) {
        continue;
      }
      bool first = false;  // a new momentum buffer: it takes the first direction
      at::Tensor buffer;
      if (options.momentum() != 0) {
        auto& slot = state_[compat::optim_state_key(state_, p)];
        if (!slot) {
          slot = std::make_unique<torch::optim::SGDParamState>();
        }
        auto& st = static_cast<torch::optim::SGDParamState&>(*slot);
        if (!st.momentum_buffer().defined()) {
          // The base class clones the first direction into the buffer.
          st.momentum_buffer(at::empty_like(p, at::MemoryFormat::Contiguous));
          first = true;
        }
        buffer = st.momentum_buffer();
      }
      if (!p.device().is_cpu()) {
        SgdBatch& b = batches[{g, p.device().index(), p.scalar_type(), first}];
        if (b.params.empty()) {
          b.lr = options.lr();
          b.momentum = options.momentum();
          b.dampening = options.dampening();
          b.weight_decay = options.weight_decay();
          b.nesterov = options.nesterov();
          b.first = first;
        }
        b.params.push_back(p);
        b.grads.push_back(grad);
        if (buffer.defined()) {
          b.buffers.push_back(buffer);
        }
        continue;
      }
      kernels::SgdJob job;
      job.param = p.data_ptr();
      job.grad = grad.data_ptr();
      job.momentum_buffer = buffer.defined() ? buffer.data_ptr() : nullptr;
      job.first = first;
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
  kernels::sgd_step_cpu(jobs, grad_scale_ptr(args));
  for (auto& [key, b] : batches) {
    compat::fused_sgd(b.params, b.grads, b.buffers, b.weight_decay, b.momentum, b.lr, b.dampening,
                      b.nesterov, b.first, grad_scale_on(b.params.front().device(), args));
  }
}

at::Tensor Adam::step(LossClosure closure) {
  return fused_or_base_step<Adam, torch::optim::Adam>(*this, std::move(closure));
}

bool Adam::supports_amp_scaling() const {
  return fusable<torch::optim::AdamParamState>(*this,
                                               adam_state_tensors<torch::optim::AdamParamState>);
}

void Adam::amp_step(const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamOptions, torch::optim::AdamParamState>(*this, args, false);
}

at::Tensor AdamW::step(LossClosure closure) {
  return fused_or_base_step<AdamW, torch::optim::AdamW>(*this, std::move(closure));
}

bool AdamW::supports_amp_scaling() const {
  return fusable<torch::optim::AdamWParamState>(*this,
                                                adam_state_tensors<torch::optim::AdamWParamState>);
}

void AdamW::amp_step(const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(*this, args, true);
}

}  // namespace optim
}  // namespace torchamp
