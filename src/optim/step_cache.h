#pragma once

// The fused optimizers' step cache and the one walk of a step over it
// (prepare): inline, as it runs once per parameter and step. Private to
// src/optim/.

#include "kernels/optim_kernels.h"
#include "optim/master_weights.h"

#include <c10/util/Exception.h>

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
  Plan& plan() { return *plan_; }
  const Plan& plan() const { return *plan_; }

 private:
  std::unique_ptr<Plan> plan_;
};

// One parameter of the optimizer, in param-group order.
struct CachedParam {
  at::Tensor param;  // held: its address (its state key) cannot be reused while cached
  StateKey key;      // computed once: on LibTorch 1.13 a formatted string
  size_t group;
  size_t index;                             // in its group, for errors
  bool master = false;                      // it has (or will have) a master weight
  bool stochastic = false;                  // its updates round stochastically
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

// What prepare_amp_step() found for the amp_step() right after it: the
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

// What the optimizer's FusedOptions decide for every parameter's step.
struct StepRules {
  bool masters = false;      // master_weights: float32 masters and state for 16-bit parameters
  bool stochastic = false;   // stochastic_rounding (bfloat16 parameters)
  bool float_state = false;  // state_dtype(kFloat), with stochastic rounding
  bool aten_on_cpu = false;  // aten_kernels: CPU parameters take ATen's path
  // Whether `p` has a master weight.
  bool master(const at::Tensor& p) const { return masters && low_precision(p.scalar_type()); }
  // The dtype of `p`'s state: float32 with a master or where the options
  // ask for it, else the parameter's own.
  at::ScalarType state_dtype(const at::Tensor& p) const {
    return master(p) || (stochastic && float_state) ? at::kFloat : p.scalar_type();
  }
  // A step the fused update cannot take throws instead of falling back.
  bool must_fuse() const { return masters || stochastic; }
};

// Whether a parameter takes ATen's fused ops (CUDA, and CPU with
// FusedOptions().aten_kernels) rather than torchamp's CPU kernels.
inline bool takes_aten(const at::Tensor& p, bool aten_on_cpu) {
  return !p.device().is_cpu() || aten_on_cpu;
}

// Dense contiguous parameters with gradients of their dtype: on the CPU to
// torchamp's kernels; on CUDA (and the CPU with `aten_on_cpu`) to ATen's
// multi-tensor fused ops where this LibTorch has them, master weights and
// stochastic rounding as ATen ops around them (aten_masters.h,
// aten_rounding.h).
inline bool fusable_param(const at::Tensor& p, const at::Tensor& grad, bool aten_on_cpu) {
  const auto dtype = p.scalar_type();
  if (!kernels::optim_supports(dtype) || !dense_on(p, dtype, p.device()) ||
      !dense_on(grad, dtype, p.device())) {
    return false;
  }
  if (!takes_aten(p, aten_on_cpu)) {
    return true;
  }
  return compat::kAtenFusedOptimizers && (p.device().is_cpu() || p.device().is_cuda());
}

inline bool same_state(const CachedParam& c, const ParamState* st, const StateTensors& ts) {
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

// Whether a state's tensors can take the fused update: dense, contiguous,
// of `dtype` (the state's: float32 with a master) and of the parameter's
// device and size.
inline bool state_fits(const StateTensors& ts, at::ScalarType dtype, const at::Tensor& p) {
  for (const at::Tensor* t : ts) {
    if (t->defined() && (!dense_on(*t, dtype, p.device()) || t->numel() != p.numel())) {
      return false;
    }
  }
  return true;
}

// Whether a state the cache has not seen can take the fused update; if so
// the cache keeps it.
inline bool accept_state(CachedParam& c, const ParamState* st, const StateTensors& ts) {
  if (!state_fits(ts, c.state_dtype, c.param)) {
    return false;
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

inline void prefetch_ahead(const StepCache::Plan& plan, size_t i) {
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
inline void prefetch_ready(const StepCache::Plan& plan, size_t j) {
  if (j < plan.ready.size()) {
    const ReadyParam& ahead = plan.ready[j];
    __builtin_prefetch(ahead.state);
    __builtin_prefetch(ahead.grad->unsafeGetTensorImpl());
    prefetch_ahead(plan, ahead.index);
  }
}

// A later stage, nearer: the storages behind the tensors fetched above
// (their data pointers), now that the tensors' own metadata is in.
inline void prefetch_storages(const StepCache::Plan& plan, size_t i) {
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

// A parameter the update must take but cannot (only with master weights or
// stochastic rounding, `stochastic`: the base class's step would ignore them).
[[noreturn]] void refuse_unfusable(size_t group, size_t index, const at::Tensor& p,
                                   const at::Tensor& grad, const char* what, bool stochastic);

// A parameter stochastic rounding does not apply to (not bfloat16).
[[noreturn]] void refuse_stochastic(size_t group, size_t index, const at::Tensor& p);

// The verdict on one parameter with a gradient, the same in the step's walk
// and in the question (can_fuse): whether it, and its state
// (`state_fits_now()`), can take the fused update. With master weights or
// stochastic rounding (`must_fuse`) one that cannot throws instead.
template <class StateFits>
bool param_can_fuse(const at::Tensor& p, const at::Tensor& grad, bool stochastic, bool must_fuse,
                    bool aten_on_cpu, size_t group, size_t index, StateFits state_fits_now) {
  if (stochastic && p.scalar_type() != at::kBFloat16) {
    refuse_stochastic(group, index, p);
  }
  if (!fusable_param(p, grad, aten_on_cpu)) {
    if (must_fuse) {
      refuse_unfusable(group, index, p, grad, "parameter or gradient", stochastic);
    }
    return false;
  }
  if (!state_fits_now()) {
    if (must_fuse) {
      refuse_unfusable(group, index, p, grad, "state", stochastic);
    }
    return false;
  }
  return true;
}

// supports_amp_scaling(): the walk's verdict without the walk's cache,
// changing nothing (no state remembered, no master made or dropped).
template <class State, class TensorsOf>
bool can_fuse(const torch::optim::Optimizer& opt, const StepRules& rules, TensorsOf tensors_of) {
  const auto& state = opt.state();
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t k = 0; k < params.size(); ++k) {
      const at::Tensor& p = params[k];
      const at::Tensor& grad = p.unsafeGetTensorImpl()->grad();
      if (!grad.defined()) {
        continue;
      }
      auto fits = [&] {
        const auto it = state.find(compat::optim_state_key(state, p));
        return it == state.end() || state_fits(tensors_of(static_cast<const State&>(*it->second)),
                                               rules.state_dtype(p), p);
      };
      if (!param_can_fuse(p, grad, rules.stochastic, rules.must_fuse(), rules.aten_on_cpu, g, k,
                          fits)) {
        return false;
      }
    }
  }
  return true;
}

// The one walk of a step: checks that every parameter with a gradient can
// take the fused update (parameter, gradient and state dense, contiguous,
// of one supported dtype, on the CPU or, with ATen's fused ops, CUDA) and
// notes what the update needs. The cache is validated on the way: a
// parameter list that differs from the cached one (a new group, a parameter
// added, removed or replaced) rebuilds it; each state is looked up by its
// cached key and compared with the one last seen (a load(), an entry
// replaced or erased, a state tensor replaced or resized), and a new one is
// checked before it is used. With master weights or stochastic rounding
// (`rules.must_fuse()`), a step the fused update cannot take throws instead.
template <class State, class TensorsOf>
bool prepare(const torch::optim::Optimizer& opt, StepCache::Plan& plan, MasterWeights& masters,
             const StepRules& rules, TensorsOf tensors_of) {
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
        c.master = rules.master(p);
        c.stochastic = rules.stochastic;
        c.state_dtype = rules.state_dtype(p);
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
    ParamState* st = plan.found[i];
    auto fits = [&] {
      if (st == nullptr) {
        return true;
      }
      const StateTensors ts = tensors_of(static_cast<const State&>(*st));
      return same_state(c, st, ts) || accept_state(c, st, ts);
    };
    if (!param_can_fuse(p, grad, c.stochastic, rules.must_fuse(), rules.aten_on_cpu, c.group,
                        c.index, fits)) {
      return false;
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

// amp_step's start: what prepare_amp_step() prepared, or a walk of its
// own when called alone. Throws, before anything is written, when the step
// cannot be fused.
template <class State, class TensorsOf>
StepCache::Plan& ready_plan(const torch::optim::Optimizer& opt, StepCache& cache,
                            MasterWeights& masters, const StepRules& rules, TensorsOf tensors_of) {
  StepCache::Plan& plan = cache.plan();
  if (!plan.prepared) {
    TORCH_CHECK(prepare<State>(opt, plan, masters, rules, tensors_of),
                "amp_step: this step's parameters, gradients or state cannot take the fused "
                "update (prepare_amp_step() is false)");
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

}  // namespace optim
}  // namespace torchamp
