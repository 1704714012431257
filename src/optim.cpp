#include <torchamp/optim.h>

#include "compat.h"
#include "kernels/optim_kernels.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchamp {
namespace optim {

// What a fused optimizer keeps between steps so that its per-parameter
// bookkeeping is a small constant: each parameter's state key (computed
// once, not per step) and the state it last validated, checked again on
// every step before anything is written (a new or replaced parameter, a
// `load()`, a state entry or state tensor replaced by the user or by
// LibTorch all show). Not the optimizer's state: `save`/`load` and
// checkpoints are the base class's. A copy starts empty. It holds
// references to the parameters and state tensors it last validated, so a
// parameter removed or a state replaced stays allocated until the next step
// (or the optimizer's end).
class StepCache {
 public:
  StepCache();
  ~StepCache();
  StepCache(const StepCache& other);
  StepCache& operator=(const StepCache& other);
  struct Plan;
  Plan& plan() const { return *plan_; }

 private:
  std::unique_ptr<Plan> plan_;
};

// The float32 master weights of a fused optimizer (its part of the state).
class MasterWeights {
 public:
  explicit MasterWeights(bool on = false);
  ~MasterWeights();
  MasterWeights(const MasterWeights& other) = delete;
  MasterWeights& operator=(const MasterWeights& other) = delete;
  bool on() const { return on_; }
  struct Store;
  Store& store() const { return *store_; }

 private:
  bool on_;
  std::unique_ptr<Store> store_;
};

struct detail::FusedState::Impl {
  explicit Impl(bool master_weights) : masters(master_weights) {}
  StepCache cache;
  MasterWeights masters;
};

detail::FusedState::FusedState(bool master_weights)
    : impl_(std::make_unique<Impl>(master_weights)) {}
detail::FusedState::~FusedState() = default;

namespace {

bool dense_on(const at::Tensor& t, at::ScalarType dtype, c10::Device device) {
  return t.defined() && t.layout() == at::kStrided && t.device() == device &&
         t.scalar_type() == dtype && t.is_contiguous();
}

bool low_precision(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16;
}

// Dense contiguous CPU parameters go to torchamp's kernels; dense contiguous
// CUDA ones to ATen's multi-tensor fused ops where this LibTorch has them
// (not with a master weight: those are torchamp's kernels only).
bool fusable_param(const at::Tensor& p, const at::Tensor& grad, bool master) {
  const auto dtype = p.scalar_type();
  if (!kernels::optim_supports(dtype) || !dense_on(p, dtype, p.device()) ||
      !dense_on(grad, dtype, p.device())) {
    return false;
  }
  return p.device().is_cpu() || (!master && compat::kAtenFusedOptimizers && p.device().is_cuda());
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
  size_t index;                             // in its group, for errors
  bool master = false;                      // it has (or will have) a master weight
  at::ScalarType state_dtype = at::kFloat;  // its state's: float32 with a master
  // The state last validated, with its tensors' identities (held, so that a
  // replaced tensor cannot come back at the same address) and data.
  const ParamState* state = nullptr;
  std::array<at::Tensor, 3> tensors;
  std::array<const void*, 3> data{};
  std::array<int64_t, 3> numel{};
  // Its master weight's data as of the master store's `version` (a lookup
  // per parameter and step was most of a master step's cost on small tensors).
  uint64_t master_version = ~uint64_t{0};
  void* master_data = nullptr;
  int64_t master_numel = 0;
};

// What supports_amp_scaling() found for the amp_step() right after it: the
// parameters with a gradient this step, and their state (null: none yet).
struct ReadyParam {
  size_t index;  // into StepCache::Plan::params
  const at::Tensor* grad;
  ParamState* state;
  void* param_data;  // read once here, for the update's job
  void* grad_data;
  void* master_data;  // its master weight's; null: none (yet)
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

// The masters by parameter (held, so that its address is not reused while
// the entry lives). bfloat16: an int16 remainder; float16: a float32 copy.
struct MasterWeights::Store {
  struct Entry {
    at::Tensor param;
    at::Tensor master;
  };
  std::unordered_map<const c10::TensorImpl*, Entry> entries;
  uint64_t version = 0;  // bumped by every change of `entries`
};

MasterWeights::MasterWeights(bool on) : on_(on), store_(std::make_unique<Store>()) {}
MasterWeights::~MasterWeights() = default;

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
        (!dense_on(t, c.state_dtype, c.param.device()) || t.numel() != c.param.numel())) {
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

// A parameter the update must take but cannot (only with master weights: the
// base class's step would ignore them).
[[noreturn]] void refuse_unfusable(size_t group, size_t index, const at::Tensor& p,
                                   const at::Tensor& grad, const char* what) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "torchamp::optim with master weights: param_groups[", group, "].params[", index, "] (",
      p.scalar_type(), " on ", p.device(), ") cannot take the fused update: its ", what,
      " (gradient ", grad.scalar_type(), ", ", grad.layout(),
      grad.layout() == at::kStrided && !grad.is_contiguous() ? ", not contiguous" : "",
      "). Master weights need dense contiguous CPU parameters, gradients of the parameter's "
      "dtype, and state of float32 (float16/bfloat16 parameters) or the parameter's dtype.");
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
bool prepare(const torch::optim::Optimizer& opt, StepCache::Plan& plan,
             const MasterWeights& masters, TensorsOf tensors_of) {
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
    auto& store = masters.store().entries;
    std::unordered_map<const c10::TensorImpl*, MasterWeights::Store::Entry> kept;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const auto& p : groups[g].params()) {
        CachedParam c;
        c.param = p;
        c.key = compat::optim_state_key(state, p);
        c.group = g;
        c.index = static_cast<size_t>(&p - groups[g].params().data());
        c.master = masters.on() && low_precision(p.scalar_type());
        c.state_dtype = c.master ? at::kFloat : p.scalar_type();
        auto it = store.find(p.unsafeGetTensorImpl());
        if (it != store.end()) {
          kept.insert(*it);
        }
        plan.params.push_back(std::move(c));
      }
    }
    store = std::move(kept);  // masters of parameters no longer in the optimizer go
    ++masters.store().version;
    TORCH_INTERNAL_ASSERT(attempt == 0, "the rebuilt step cache does not match the param groups");
  }
  // Each parameter with a gradient, and its state.
  const auto& store = masters.store().entries;
  const uint64_t store_version = masters.store().version;
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
    if (!fusable_param(p, grad, c.master)) {
      if (masters.on()) {
        refuse_unfusable(c.group, c.index, p, grad, "parameter or gradient");
      }
      return false;
    }
    ParamState* st = plan.found[i];
    if (st != nullptr) {
      const StateTensors ts = tensors_of(static_cast<const State&>(*st));
      if (!same_state(c, st, ts) && !accept_state(c, st, ts)) {
        if (masters.on()) {
          refuse_unfusable(c.group, c.index, p, grad, "state");
        }
        return false;
      }
    }
    void* master_data = nullptr;
    if (c.master) {
      if (c.master_version != store_version) {
        auto it = store.find(p.unsafeGetTensorImpl());
        c.master_data = it != store.end() ? data_of(it->second.master) : nullptr;
        c.master_numel = it != store.end() ? it->second.master.numel() : 0;
        c.master_version = store_version;
      }
      TORCH_CHECK(c.master_data == nullptr || c.master_numel == p.numel(),
                  "torchamp::optim: param_groups[", c.group, "].params[", c.index,
                  "] changed size (", p.numel(), " elements, its master weight ", c.master_numel,
                  ")");
      master_data = c.master_data;
    }
    plan.ready.push_back({i, &grad, st, data_of(p), data_of(grad), master_data});
  }
  plan.prepared = true;
  return true;
}

// amp_step's start: what supports_amp_scaling() prepared, or a walk of its
// own when called alone. Throws, before anything is written, when the step
// cannot be fused.
template <class State, class TensorsOf>
StepCache::Plan& ready_plan(const torch::optim::Optimizer& opt, const StepCache& cache,
                            const MasterWeights& masters, TensorsOf tensors_of) {
  StepCache::Plan& plan = cache.plan();
  if (!plan.prepared) {
    TORCH_CHECK(prepare<State>(opt, plan, masters, tensors_of),
                "amp_step: this step's parameters, gradients or state cannot take the fused "
                "update (supports_amp_scaling() is false)");
  }
  plan.prepared = false;
  return plan;
}

// A new state tensor of a parameter: zeros of its state's dtype.
at::Tensor state_zeros(const CachedParam& c) {
  return at::zeros(c.param.sizes(), c.param.options().dtype(c.state_dtype));
}

// A parameter's master weight, made at its first step: exactly the
// parameter's value (a bfloat16 parameter's remainder is zero).
void* make_master(const MasterWeights& masters, const CachedParam& c) {
  const at::Tensor& p = c.param;
  at::Tensor master = p.scalar_type() == at::kBFloat16
                          ? at::zeros(p.sizes(), p.options().dtype(at::kShort))
                          : p.to(at::kFloat).contiguous();
  void* data = data_of(master);
  masters.store().entries[p.unsafeGetTensorImpl()] = {p, std::move(master)};
  ++masters.store().version;
  return data;
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
void adam_fused(torch::optim::Optimizer& opt, const StepCache& cache, const MasterWeights& masters,
                const AmpStepArgs& args, bool decoupled) {
  StepCache::Plan& plan = ready_plan<State>(opt, cache, masters, adam_tensors<State>);
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

// The archive entry of the master weights: one tensor per parameter that
// has one, keyed by its flat index in param-group order (as the base
// classes' own state), and a format marker.
constexpr const char* kMasterArchive = "torchamp_master_weights";

void save_masters(const torch::optim::Optimizer& opt, const MasterWeights& masters,
                  torch::serialize::OutputArchive& archive) {
  if (!masters.on()) {
    return;
  }
  torch::serialize::OutputArchive sub;
  sub.write("format", c10::IValue(static_cast<int64_t>(1)));
  const auto& entries = masters.store().entries;
  size_t flat = 0;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = entries.find(p.unsafeGetTensorImpl());
      if (it != entries.end()) {
        sub.write(std::to_string(flat), it->second.master, /*is_buffer=*/true);
      }
      ++flat;
    }
  }
  archive.write(kMasterArchive, sub);
}

// Reads and checks an archive's master weights against the optimizer,
// changing nothing.
std::unordered_map<const c10::TensorImpl*, MasterWeights::Store::Entry> read_masters(
    const torch::optim::Optimizer& opt, const MasterWeights& masters,
    torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive sub;
  const bool has = archive.try_read(kMasterArchive, sub);
  TORCH_CHECK_VALUE(has || !masters.on(),
                    "torchamp::optim load: this optimizer keeps master weights "
                    "(FusedOptions().master_weights(true)) but the archive has none (it was saved "
                    "by an optimizer without them); nothing was loaded.");
  TORCH_CHECK_VALUE(!has || masters.on(),
                    "torchamp::optim load: the archive holds master weights ('", kMasterArchive,
                    "') but this optimizer keeps none; construct it with "
                    "FusedOptions().master_weights(true). Nothing was loaded.");
  std::unordered_map<const c10::TensorImpl*, MasterWeights::Store::Entry> loaded;
  if (!has) {
    return loaded;
  }
  size_t flat = 0;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const std::string key = std::to_string(flat++);
      at::Tensor master;
      if (!sub.try_read(key, master, /*is_buffer=*/true)) {
        continue;  // no step yet: made at its first
      }
      const at::ScalarType want = p.scalar_type() == at::kBFloat16 ? at::kShort : at::kFloat;
      TORCH_CHECK_VALUE(low_precision(p.scalar_type()) && master.scalar_type() == want &&
                            master.numel() == p.numel() && master.device() == p.device(),
                        "torchamp::optim load: the master weight '", key, "' (",
                        master.scalar_type(), ", ", master.numel(),
                        " elements) does not fit parameter ", key, " (", p.scalar_type(), ", ",
                        p.numel(),
                        " elements); nothing was loaded. A bfloat16 parameter's master is an int16 "
                        "remainder, a float16 parameter's a float32 copy, one element each.");
      loaded[p.unsafeGetTensorImpl()] = {p, master.contiguous()};
    }
  }
  return loaded;
}

at::Tensor master_storage(const MasterWeights& masters, const at::Tensor& param) {
  const auto& entries = masters.store().entries;
  auto it = entries.find(param.unsafeGetTensorImpl());
  return it == entries.end() ? at::Tensor() : it->second.master;
}

// The float32 value of a parameter's master (a new tensor).
at::Tensor master_value(const MasterWeights& masters, const at::Tensor& param) {
  const at::Tensor master = master_storage(masters, param);
  if (!master.defined() || param.scalar_type() != at::kBFloat16) {
    return master.defined() ? master.clone() : master;
  }
  at::Tensor out = at::empty(param.sizes(), param.options().dtype(at::kFloat));
  const at::Tensor p = param.contiguous();
  const auto* hi = static_cast<const uint16_t*>(p.data_ptr());
  const auto* rem = master.data_ptr<int16_t>();
  auto* bits = static_cast<uint32_t*>(out.data_ptr());
  for (int64_t i = 0; i < out.numel(); ++i) {
    bits[i] = (static_cast<uint32_t>(hi[i]) << 16) + static_cast<uint32_t>(int32_t{rem[i]});
  }
  return out;
}

}  // namespace

namespace {

// SGD's fused update (torchamp's kernels on the CPU, ATen's fused op on
// CUDA), beside adam_fused.
void sgd_fused(torch::optim::Optimizer& opt, const StepCache& cache, const MasterWeights& masters,
               const AmpStepArgs& args) {
  StepCache::Plan& plan = ready_plan<torch::optim::SGDParamState>(opt, cache, masters, sgd_tensors);
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
    jobs.push_back(job);
  }
  kernels::sgd_step_cpu(jobs, grad_scale_ptr(args));
  for (auto& [key, b] : batches) {
    compat::fused_sgd(b.params, b.grads, b.buffers, b.weight_decay, b.momentum, b.lr, b.dampening,
                      b.nesterov, b.first, grad_scale_on(b.params.front().device(), args));
  }
}

// What differs between the three: the per-parameter state's type and
// tensors, and the update.
template <class Base>
struct Update;

template <>
struct Update<torch::optim::SGD> {
  using State = torch::optim::SGDParamState;
  static StateTensors tensors(const State& s) { return sgd_tensors(s); }
  static void step(torch::optim::Optimizer& opt, const detail::FusedState::Impl& f,
                   const AmpStepArgs& args) {
    sgd_fused(opt, f.cache, f.masters, args);
  }
};

// Adam and AdamW: one update, with AdamW's weight decay decoupled.
template <class Options, class ParamState, bool kDecoupled>
struct AdamUpdate {
  using State = ParamState;
  static StateTensors tensors(const State& s) { return adam_tensors(s); }
  static void step(torch::optim::Optimizer& opt, const detail::FusedState::Impl& f,
                   const AmpStepArgs& args) {
    adam_fused<Options, State>(opt, f.cache, f.masters, args, kDecoupled);
  }
};

template <>
struct Update<torch::optim::Adam>
    : AdamUpdate<torch::optim::AdamOptions, torch::optim::AdamParamState, false> {};

template <>
struct Update<torch::optim::AdamW>
    : AdamUpdate<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true> {};

}  // namespace

template <class Base>
Fused<Base>::Fused(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults,
                   FusedOptions fused)
    : Base(std::move(param_groups), std::move(defaults)), fused_(fused.master_weights()) {}

template <class Base>
Fused<Base>::Fused(std::vector<at::Tensor> params, Options defaults, FusedOptions fused)
    : Base(std::move(params), std::move(defaults)), fused_(fused.master_weights()) {}

template <class Base>
Fused<Base>::~Fused() = default;

template <class Base>
at::Tensor Fused<Base>::step(torch::optim::Optimizer::LossClosure closure) {
  return fused_or_base_step<Fused, Base>(*this, std::move(closure));
}

template <class Base>
bool Fused<Base>::supports_amp_scaling() const {
  const auto& f = fused_.impl();
  return prepare<typename Update<Base>::State>(*this, f.cache.plan(), f.masters,
                                               Update<Base>::tensors);
}

template <class Base>
void Fused<Base>::amp_step(const AmpStepArgs& args) {
  Update<Base>::step(*this, fused_.impl(), args);
}

template <class Base>
void Fused<Base>::save(torch::serialize::OutputArchive& archive) const {
  Base::save(archive);
  save_masters(*this, fused_.impl().masters, archive);
}

template <class Base>
void Fused<Base>::load(torch::serialize::InputArchive& archive) {
  auto& f = fused_.impl();
  auto loaded = read_masters(*this, f.masters, archive);
  Base::load(archive);
  f.masters.store().entries = std::move(loaded);
  ++f.masters.store().version;
  f.cache = StepCache();
}

template <class Base>
FusedOptions Fused<Base>::fused_options() const {
  return FusedOptions().master_weights(fused_.impl().masters.on());
}

template <class Base>
at::Tensor Fused<Base>::master_weight(const at::Tensor& param) const {
  return master_value(fused_.impl().masters, param);
}

template <class Base>
at::Tensor Fused<Base>::master_weight_storage(const at::Tensor& param) const {
  return master_storage(fused_.impl().masters, param);
}

template class Fused<torch::optim::SGD>;
template class Fused<torch::optim::Adam>;
template class Fused<torch::optim::AdamW>;

}  // namespace optim
}  // namespace torchamp
