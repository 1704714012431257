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
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
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

using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = StateMap::key_type;
using ParamState = torch::optim::OptimizerParamState;

// A state's tensors (up to three; undefined where the state has fewer).
using StateTensors = std::array<const at::Tensor*, 3>;

}  // namespace

// One parameter of the optimizer, in param-group order.
struct CachedParam {
  at::Tensor param;  // held: its address (its state key) cannot be reused while cached
  StateKey key;      // computed once: on LibTorch 1.13 a formatted string
  size_t group;
  // The state last validated, with its tensors' identities (held, so that a
  // replaced tensor cannot come back at the same address) and data.
  const ParamState* state = nullptr;
  std::array<at::Tensor, 3> tensors;
  std::array<const void*, 3> data{};
  std::array<int64_t, 3> numel{};
};

// What supports_amp_scaling() found for the amp_step() right after it: the
// parameters with a gradient this step, and their state (null: none yet).
struct ReadyParam {
  size_t index;  // into StepCache::Plan::params
  const at::Tensor* grad;
  ParamState* state;
  void* param_data;  // read once here, for the update's job
  void* grad_data;
};

struct StepCache::Plan {
  std::vector<CachedParam> params;
  std::vector<ParamState*> found;  // each parameter's state this step (scratch)
  std::vector<ReadyParam> ready;
  bool prepared = false;
};

StepCache::StepCache() : plan_(std::make_unique<Plan>()) {}
StepCache::~StepCache() = default;
StepCache::StepCache(const StepCache& /*other*/) : plan_(std::make_unique<Plan>()) {}
StepCache& StepCache::operator=(const StepCache& other) {
  if (this != &other) {
    plan_ = std::make_unique<Plan>();
  }
  return *this;
}

namespace {

// A dense tensor's data, for writing, without data_ptr()'s out-of-line
// checks (the tensor is known dense and, checked before, of a supported dtype).
void* data_of(const at::Tensor& t) {
  return compat::dense_data_for_write(*t.unsafeGetTensorImpl());
}

bool same_state(const CachedParam& c, const ParamState* st, const StateTensors& ts) {
  if (c.state != st) {
    return false;
  }
  for (size_t k = 0; k < ts.size(); ++k) {
    const at::Tensor& t = *ts[k];
    if (t.unsafeGetTensorImpl() != c.tensors[k].unsafeGetTensorImpl() ||
        (t.defined() && (t.numel() != c.numel[k] || data_of(t) != c.data[k]))) {
      return false;
    }
  }
  return true;
}

// Whether a state the cache has not seen can take the fused update (its
// tensors dense, contiguous, of the parameter's dtype and device); if so the
// cache keeps it.
bool accept_state(CachedParam& c, const ParamState* st, const StateTensors& ts) {
  for (size_t k = 0; k < ts.size(); ++k) {
    const at::Tensor& t = *ts[k];
    if (t.defined() &&
        (!dense_on(t, c.param.scalar_type(), c.param.device()) || t.numel() != c.param.numel())) {
      return false;
    }
  }
  c.state = st;
  for (size_t k = 0; k < ts.size(); ++k) {
    c.tensors[k] = *ts[k];
    c.data[k] = ts[k]->defined() ? data_of(*ts[k]) : nullptr;
    c.numel[k] = ts[k]->defined() ? ts[k]->numel() : 0;
  }
  return true;
}

// The walk's metadata (each parameter's tensor, its state and the state's
// tensors: separate heap objects) is cold every step, the update's streaming
// having pushed it out of the caches: fetch a few parameters ahead.
constexpr size_t kPrefetchDistance = 6;

void prefetch_ahead(const StepCache::Plan& plan, size_t i) {
  if (i < plan.params.size()) {
    const CachedParam& c = plan.params[i];
    __builtin_prefetch(c.param.unsafeGetTensorImpl());
    __builtin_prefetch(c.state);
    if (i < plan.found.size()) {
      __builtin_prefetch(plan.found[i]);
    }
    for (const auto& t : c.tensors) {
      __builtin_prefetch(t.unsafeGetTensorImpl());
    }
  }
}

// The update's loop over what the walk prepared: the same metadata, the
// state and the gradient a few entries ahead.
void prefetch_ready(const StepCache::Plan& plan, size_t j) {
  if (j < plan.ready.size()) {
    const ReadyParam& ahead = plan.ready[j];
    __builtin_prefetch(ahead.state);
    __builtin_prefetch(ahead.grad->unsafeGetTensorImpl());
    prefetch_ahead(plan, ahead.index);
  }
}

// A later stage, nearer: the storages behind the tensors fetched above
// (their data pointers), now that the tensors' own metadata is in.
void prefetch_storages(const StepCache::Plan& plan, size_t i) {
  if (i < plan.params.size()) {
    const CachedParam& c = plan.params[i];
    __builtin_prefetch(c.param.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
    for (const auto& t : c.tensors) {
      if (t.defined()) {
        __builtin_prefetch(t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl());
      }
    }
  }
}

// The one walk of a step: checks that every parameter with a gradient can
// take the fused update (parameter, gradient and state dense, contiguous,
// of one supported dtype, on the CPU or, with ATen's fused ops, CUDA) and
// notes what the update needs. The cache is validated on the way: a
// parameter list that differs from the cached one (a new group, a parameter
// added, removed or replaced) rebuilds it; each state is looked up by its
// cached key and compared with the one last seen (a load(), an entry
// replaced or erased, a state tensor replaced or resized), and a new one is
// checked before it is used.
template <class State, class TensorsOf>
bool prepare(const torch::optim::Optimizer& opt, StepCache::Plan& plan, TensorsOf tensors_of) {
  plan.prepared = false;
  plan.ready.clear();
  const auto& groups = opt.param_groups();
  const auto& state = opt.state();
  for (int attempt = 0; attempt < 2; ++attempt) {
    // The parameter list against the cached one, and every state lookup.
    // The lookups do not depend on each other, so the CPU overlaps their
    // cache misses (one per hash-table slot) when they run back to back.
    bool structure_changed = false;
    size_t i = 0;
    plan.found.resize(plan.params.size());
    for (size_t g = 0; g < groups.size() && !structure_changed; ++g) {
      for (const auto& p : groups[g].params()) {
        if (i >= plan.params.size() || plan.params[i].group != g ||
            plan.params[i].param.unsafeGetTensorImpl() != p.unsafeGetTensorImpl()) {
          structure_changed = true;
          break;
        }
        const auto it = state.find(plan.params[i].key);
        plan.found[i++] = it == state.end() ? nullptr : it->second.get();
      }
    }
    if (!structure_changed && i == plan.params.size()) {
      break;
    }
    // Rebuild: every parameter, its key computed once.
    plan.params.clear();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const auto& p : groups[g].params()) {
        CachedParam c;
        c.param = p;
        c.key = compat::optim_state_key(state, p);
        c.group = g;
        plan.params.push_back(std::move(c));
      }
    }
    TORCH_INTERNAL_ASSERT(attempt == 0, "the rebuilt step cache does not match the param groups");
  }
  // Each parameter with a gradient, and its state.
  for (size_t i = 0; i < plan.params.size(); ++i) {
    prefetch_ahead(plan, i + 2 * kPrefetchDistance);
    prefetch_storages(plan, i + kPrefetchDistance);
    CachedParam& c = plan.params[i];
    const at::Tensor& p = c.param;
    // The impl's own accessor: Tensor::grad() also asks autograd whether the
    // tensor is a leaf, for a warning that does not apply to parameters.
    const at::Tensor& grad = p.unsafeGetTensorImpl()->grad();
    if (!grad.defined()) {
      continue;
    }
    if (!fusable_param(p, grad)) {
      return false;
    }
    ParamState* st = plan.found[i];
    if (st != nullptr) {
      const StateTensors ts = tensors_of(static_cast<const State&>(*st));
      if (!same_state(c, st, ts) && !accept_state(c, st, ts)) {
        return false;
      }
    }
    plan.ready.push_back({i, &grad, st, data_of(p), data_of(grad)});
  }
  plan.prepared = true;
  return true;
}

// amp_step's start: what supports_amp_scaling() prepared, or a walk of its
// own when called alone. Throws, before anything is written, when the step
// cannot be fused.
template <class State, class TensorsOf>
StepCache::Plan& ready_plan(const torch::optim::Optimizer& opt, const StepCache& cache,
                            TensorsOf tensors_of) {
  StepCache::Plan& plan = cache.plan();
  if (!plan.prepared) {
    TORCH_CHECK(prepare<State>(opt, plan, tensors_of),
                "amp_step: this step's parameters, gradients or state cannot take the fused "
                "update (supports_amp_scaling() is false)");
  }
  plan.prepared = false;
  return plan;
}

// After amp_step created or completed a state: the cache keeps it.
template <class State, class TensorsOf>
void remember_state(CachedParam& c, const State& st, TensorsOf tensors_of) {
  const bool accepted = accept_state(c, &st, tensors_of(st));
  TORCH_INTERNAL_ASSERT(accepted, "a state made for the fused update must be fusable");
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

template <class State>
StateTensors adam_tensors(const State& s) {
  return {&s.exp_avg(), &s.exp_avg_sq(), &s.max_exp_avg_sq()};
}

StateTensors sgd_tensors(const torch::optim::SGDParamState& s) {
  static const at::Tensor none;
  return {&s.momentum_buffer(), &none, &none};
}

template <class Options, class State>
void adam_fused(torch::optim::Optimizer& opt, const StepCache& cache, const AmpStepArgs& args,
                bool decoupled) {
  StepCache::Plan& plan = ready_plan<State>(opt, cache, adam_tensors<State>);
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
      fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (options.amsgrad()) {
        fresh->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
      r.state = fresh.get();
      state[c.key] = std::move(fresh);
      remember_state(c, static_cast<const State&>(*r.state), adam_tensors<State>);
    }
    auto& st = static_cast<State&>(*r.state);
    if (options.amsgrad() && !st.max_exp_avg_sq().defined()) {
      st.max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      remember_state(c, st, adam_tensors<State>);
    }
    st.step(st.step() + 1);
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
    jobs.push_back(job);
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
  return prepare<torch::optim::SGDParamState>(*this, cache_.plan(), sgd_tensors);
}

void SGD::amp_step(const AmpStepArgs& args) {
  StepCache::Plan& plan = ready_plan<torch::optim::SGDParamState>(*this, cache_, sgd_tensors);
  if (args.found_inf) {  // as ATen's kernels with found_inf set: nothing changes
    return;
  }
  at::NoGradGuard no_grad;
  std::vector<kernels::SgdJob> jobs;
  jobs.reserve(plan.ready.size());
  std::map<BatchKey, SgdBatch> batches;
  auto& groups = param_groups();
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
        state_[c.key] = std::move(fresh);
      }
      auto& st = static_cast<torch::optim::SGDParamState&>(*r.state);
      if (!st.momentum_buffer().defined()) {
        // The base class clones the first direction into the buffer.
        st.momentum_buffer(at::empty_like(p, at::MemoryFormat::Contiguous));
        first = true;
        remember_state(c, st, sgd_tensors);
      }
      buffer = st.momentum_buffer();
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
    jobs.push_back(job);
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
  return prepare<torch::optim::AdamParamState>(*this, cache_.plan(),
                                               adam_tensors<torch::optim::AdamParamState>);
}

void Adam::amp_step(const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamOptions, torch::optim::AdamParamState>(*this, cache_, args, false);
}

at::Tensor AdamW::step(LossClosure closure) {
  return fused_or_base_step<AdamW, torch::optim::AdamW>(*this, std::move(closure));
}

bool AdamW::supports_amp_scaling() const {
  return prepare<torch::optim::AdamWParamState>(*this, cache_.plan(),
                                                adam_tensors<torch::optim::AdamWParamState>);
}

void AdamW::amp_step(const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(*this, cache_, args, true);
}

}  // namespace optim
}  // namespace torchamp
