#include "optim/updates.h"

#include "compat/compat.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

namespace torchamp {
namespace optim {

namespace {

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

// A new state tensor of a parameter: zeros of its state's dtype.
at::Tensor state_zeros(const CachedParam& c) {
  return at::zeros(c.param.sizes(), c.param.options().dtype(c.state_dtype));
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

// The noise key of a stochastic job (kernels::rounding_key), 0 for others.
uint64_t noise_key(const StochasticRounding& rounding, const CachedParam& c, size_t flat) {
  return c.stochastic ? kernels::rounding_key(rounding.seed, rounding.updates, flat) : 0;
}

template <class Options, class State>
void adam_fused(torch::optim::Optimizer& opt, const StepCache& cache, const MasterWeights& masters,
                StochasticRounding& rounding, const AmpStepArgs& args, bool decoupled) {
  StepCache::Plan& plan = ready_plan<State>(opt, cache, masters, rounding.on, adam_tensors<State>);
  if (args.found_inf) {  // as ATen's kernels with found_inf set: nothing changes
    return;
  }
  at::NoGradGuard no_grad;
  auto& state = opt.state();
  auto& groups = opt.param_groups();
  std::vector<kernels::AdamJob> jobs;
  jobs.reserve(plan.ready.size());
  std::map<BatchKey, AdamBatch> batches;
  // Bias corrections depend on the step count: usually one for all.
  int64_t memo_step = -1;
  double memo_beta1 = 0, memo_beta2 = 0, memo_bc1 = 1, memo_bc2_sqrt = 1;
  for (size_t j = 0; j < plan.ready.size(); ++j) {
    ReadyParam& r = plan.ready[j];
    prefetch_ready(plan, j + kPrefetchDistance);
    CachedParam& c = plan.params[r.index];
    const at::Tensor& p = c.param;
    const auto& options = static_cast<const Options&>(groups[c.group].options());
    const double beta1 = std::get<0>(options.betas());
    const double beta2 = std::get<1>(options.betas());
    if (r.state == nullptr) {  // as the base class: created at the parameter's first step
      auto fresh = std::make_unique<State>();
      fresh->step(0);
      fresh->exp_avg(state_zeros(c));
      fresh->exp_avg_sq(state_zeros(c));
      if (options.amsgrad()) {
        fresh->max_exp_avg_sq(state_zeros(c));
      }
      r.state = fresh.get();
      state[c.key] = std::move(fresh);
      remember_state(c, static_cast<const State&>(*r.state), adam_tensors<State>);
    }
    auto& st = static_cast<State&>(*r.state);
    if (options.amsgrad() && !st.max_exp_avg_sq().defined()) {
      st.max_exp_avg_sq(state_zeros(c));
      remember_state(c, st, adam_tensors<State>);
    }
    st.step(st.step() + 1);
    if (c.master && r.master_data == nullptr) {
      r.master_data = make_master(masters, c);
    }
    const at::Tensor& grad = *r.grad;
    if (!p.device().is_cpu()) {
      AdamBatch& b = batches[{c.group, p.device().index(), p.scalar_type(), false}];
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
    if (st.step() != memo_step || beta1 != memo_beta1 || beta2 != memo_beta2) {
      memo_step = st.step();
      memo_beta1 = beta1;
      memo_beta2 = beta2;
      memo_bc1 = 1 - std::pow(beta1, st.step());
      memo_bc2_sqrt = std::sqrt(1 - std::pow(beta2, st.step()));
    }
    kernels::AdamJob job;
    // The data pointers the walk validated (or remember_state recorded).
    job.param = r.param_data;
    job.master = r.master_data;
    job.grad = r.grad_data;
    job.exp_avg = const_cast<void*>(c.data[0]);
    job.exp_avg_sq = const_cast<void*>(c.data[1]);
    job.max_exp_avg_sq = options.amsgrad() ? const_cast<void*>(c.data[2]) : nullptr;
    job.numel = p.numel();
    job.dtype = p.scalar_type();
    job.lr = options.lr();
    job.beta1 = beta1;
    job.beta2 = beta2;
    job.eps = options.eps();
    job.weight_decay = options.weight_decay();
    job.step_size = options.lr() / memo_bc1;
    job.bias_correction2_sqrt = memo_bc2_sqrt;
    job.decoupled = decoupled;
    job.stochastic = c.stochastic;
    job.noise_key = noise_key(rounding, c, r.index);
    jobs.push_back(job);
  }
  kernels::adam_step_cpu(jobs, grad_scale_ptr(args));
  rounding.updates += rounding.on && !jobs.empty() ? 1 : 0;
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

// SGD's fused update (torchamp's kernels on the CPU, ATen's fused op on
// CUDA), beside adam_fused.
void sgd_fused(torch::optim::Optimizer& opt, const StepCache& cache, const MasterWeights& masters,
               StochasticRounding& rounding, const AmpStepArgs& args) {
  StepCache::Plan& plan =
      ready_plan<torch::optim::SGDParamState>(opt, cache, masters, rounding.on, sgd_tensors);
  if (args.found_inf) {  // as ATen's kernels with found_inf set: nothing changes
    return;
  }
  at::NoGradGuard no_grad;
  std::vector<kernels::SgdJob> jobs;
  jobs.reserve(plan.ready.size());
  std::map<BatchKey, SgdBatch> batches;
  auto& groups = opt.param_groups();
  for (size_t j = 0; j < plan.ready.size(); ++j) {
    ReadyParam& r = plan.ready[j];
    prefetch_ready(plan, j + kPrefetchDistance);
    CachedParam& c = plan.params[r.index];
    const at::Tensor& p = c.param;
    const auto& options = static_cast<const torch::optim::SGDOptions&>(groups[c.group].options());
    bool first = false;  // a new momentum buffer: it takes the first direction
    at::Tensor buffer;
    if (options.momentum() != 0) {
      if (r.state == nullptr) {
        auto fresh = std::make_unique<torch::optim::SGDParamState>();
        r.state = fresh.get();
        opt.state()[c.key] = std::move(fresh);
      }
      auto& st = static_cast<torch::optim::SGDParamState&>(*r.state);
      if (!st.momentum_buffer().defined()) {
        // The base class clones the first direction into the buffer.
        st.momentum_buffer(at::empty(p.sizes(), p.options().dtype(c.state_dtype)));
        first = true;
        remember_state(c, st, sgd_tensors);
      }
      buffer = st.momentum_buffer();
    }
    if (c.master && r.master_data == nullptr) {
      r.master_data = make_master(masters, c);
    }
    const at::Tensor& grad = *r.grad;
    if (!p.device().is_cpu()) {
      SgdBatch& b = batches[{c.group, p.device().index(), p.scalar_type(), first}];
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
    job.param = r.param_data;
    job.master = r.master_data;
    job.grad = r.grad_data;
    // The data pointer the walk validated (or remember_state recorded).
    job.momentum_buffer = buffer.defined() ? const_cast<void*>(c.data[0]) : nullptr;
    job.first = first;
    job.numel = p.numel();
    job.dtype = p.scalar_type();
    job.lr = options.lr();
    job.momentum = options.momentum();
    job.dampening = options.dampening();
    job.weight_decay = options.weight_decay();
    job.nesterov = options.nesterov();
    job.stochastic = c.stochastic;
    job.noise_key = noise_key(rounding, c, r.index);
    jobs.push_back(job);
  }
  kernels::sgd_step_cpu(jobs, grad_scale_ptr(args));
  rounding.updates += rounding.on && !jobs.empty() ? 1 : 0;
  for (auto& [key, b] : batches) {
    compat::fused_sgd(b.params, b.grads, b.buffers, b.weight_decay, b.momentum, b.lr, b.dampening,
                      b.nesterov, b.first, grad_scale_on(b.params.front().device(), args));
  }
}

}  // namespace

void sgd_update(torch::optim::SGD& opt, const StepCache& cache, const MasterWeights& masters,
                StochasticRounding& rounding, const AmpStepArgs& args) {
  sgd_fused(opt, cache, masters, rounding, args);
}

void adam_update(torch::optim::Adam& opt, const StepCache& cache, const MasterWeights& masters,
                 StochasticRounding& rounding, const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamOptions, torch::optim::AdamParamState>(opt, cache, masters, rounding,
                                                                      args, false);
}

void adamw_update(torch::optim::AdamW& opt, const StepCache& cache, const MasterWeights& masters,
                  StochasticRounding& rounding, const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt, cache, masters,
                                                                        rounding, args, true);
}

}  // namespace optim
}  // namespace torchamp
