#include "optim/updates.h"

#include "compat/capture.h"
#include "compat/compat.h"
#include "optim/aten_masters.h"
#include "optim/aten_rounding.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <vector>

namespace torchamp {
namespace optim {

namespace {

// What a step's AmpStepArgs say. A device scaler's flag and scale are read
// on the host only where that is free (CPU tensors) or unavoidable
// (torchamp's CPU kernels under a flag on another device); else ATen's ops
// take them as they are.
struct StepFlags {
  bool skip = false;           // known on the host: nothing changes
  std::optional<float> scale;  // for torchamp's CPU kernels
  at::Tensor found_on_device;  // the flag, not read back
  at::Tensor scale_on_device;  // the scale as a tensor (undefined: none)
  const float* scale_ptr() const { return scale ? &*scale : nullptr; }
};

float read_float(const at::Tensor& t) {
  return t.is_cpu() ? *static_cast<const float*>(t.data_ptr()) : t.item<float>();
}

// A flag or scale tensor as ATen's fused ops take it: float32, one element,
// on the CPU or where a parameter lives (a scaler keeps its state on the
// gradients' device): one elsewhere would be copied to the parameters'
// device at every step, and under a CUDA graph the copy is not what the
// user meant.
void check_arg(const torch::optim::Optimizer& opt, const at::Tensor& t, const char* name) {
  if (!t.defined()) {
    return;
  }
  TORCH_CHECK_VALUE(
      t.scalar_type() == at::kFloat && t.numel() == 1, "torchamp::optim: AmpStepArgs::", name,
      " must be a float32 tensor of one element (as ATen's fused optimizer ops "
      "take it), got ",
      t.scalar_type(), " with ", t.numel(), " elements on ", t.device(), "; nothing was changed.");
  if (t.is_cpu()) {
    return;
  }
  for (const auto& group : opt.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      if (p.device() == t.device()) {
        return;
      }
    }
  }
  TORCH_CHECK_VALUE(false, "torchamp::optim: AmpStepArgs::", name, " lives on ", t.device(),
                    ", where none of the optimizer's parameters does (a scaler keeps its state "
                    "on the gradients' device); nothing was changed.");
}

// `keep`: a CPU flag is kept as a tensor too (FusedOptions().aten_kernels:
// the CPU runs what CUDA runs).
StepFlags read_flags(const torch::optim::Optimizer& opt, const AmpStepArgs& args, bool keep) {
  check_arg(opt, args.found_inf_tensor, "found_inf_tensor");
  check_arg(opt, args.grad_scale_tensor, "grad_scale_tensor");
  TORCH_CHECK_VALUE(args.found_inf_tensor.defined() || !args.grad_scale_tensor.defined(),
                    "torchamp::optim: AmpStepArgs::grad_scale_tensor without found_inf_tensor; "
                    "nothing was changed.");
  StepFlags f;
  if (!args.found_inf_tensor.defined()) {
    f.skip = args.found_inf;
    f.scale = args.grad_scale;
    return f;
  }
  f.scale_on_device = args.grad_scale_tensor;
  if (args.found_inf_tensor.is_cpu() && !keep) {  // free to read: as the host flag
    f.skip = read_float(args.found_inf_tensor) != 0.0f;
    if (args.grad_scale_tensor.defined()) {
      f.scale = read_float(args.grad_scale_tensor);
    }
  } else {
    f.found_on_device = args.found_inf_tensor;
  }
  return f;
}

// torchamp's CPU kernels under a device flag (CPU and CUDA parameters in one
// optimizer with a CUDA scaler): the flag and the scale read back, once; the
// step then goes on as with host values.
void read_for_cpu_jobs(StepFlags& flags) {
  if (flags.found_on_device.defined()) {
    flags.skip = flags.found_on_device.item<float>() != 0.0f;
    if (flags.scale_on_device.defined()) {
      flags.scale = flags.scale_on_device.item<float>();
    }
    flags.found_on_device = at::Tensor();
  }
}

// ATen's fused ops divide each gradient by a scale tensor on its device
// (and then write it back divided); none when the gradients are unscaled.
c10::optional<at::Tensor> grad_scale_on(c10::Device device, const StepFlags& flags) {
  if (flags.scale_on_device.defined()) {
    return flags.scale_on_device.to(device);
  }
  if (!flags.scale) {
    return c10::nullopt;
  }
  return at::full({1}, *flags.scale, at::TensorOptions().dtype(at::kFloat).device(device));
}

c10::optional<at::Tensor> found_inf_on(c10::Device device, const StepFlags& flags) {
  if (!flags.found_on_device.defined()) {
    return c10::nullopt;
  }
  return flags.found_on_device.to(device);
}

// The device step count of a parameter on ATen's path, made from the
// state's count (`host_step`, before this step) where there is none for this
// state yet.
at::Tensor& device_step(detail::FusedState::Impl& f, const CachedParam& c,
                        const torch::optim::OptimizerParamState* st, int64_t host_step) {
  auto& entry = f.device_steps[c.param.unsafeGetTensorImpl()];
  if (!entry.step.defined() || entry.state != st) {
    entry.state = st;
    entry.step = at::full({}, static_cast<double>(host_step), c.param.options().dtype(at::kFloat));
  }
  return entry.step;
}

// Whether this SGD step makes r's momentum buffer (momentum, and a state
// without one).
bool makes_momentum_buffer(const torch::optim::Optimizer& opt, const StepCache::Plan& plan,
                           const ReadyParam& r) {
  const auto& options = static_cast<const torch::optim::SGDOptions&>(
      opt.param_groups()[plan.params[r.index].group].options());
  return options.momentum() != 0 &&
         (r.state == nullptr ||
          !static_cast<const torch::optim::SGDParamState*>(r.state)->momentum_buffer().defined());
}

bool new_momentum_buffers(const torch::optim::Optimizer& opt, const StepCache::Plan& plan) {
  for (const ReadyParam& r : plan.ready) {
    if (makes_momentum_buffer(opt, plan, r)) {
      return true;
    }
  }
  return false;
}

// Whether any parameter with a gradient takes torchamp's CPU kernels.
bool any_cpu_job(const StepCache::Plan& plan, bool aten_on_cpu) {
  for (const ReadyParam& r : plan.ready) {
    if (!takes_aten(plan.params[r.index].param, aten_on_cpu)) {
      return true;
    }
  }
  return false;
}

// A new state tensor of a parameter: zeros of its state's dtype.
at::Tensor state_zeros(const CachedParam& c) {
  return at::zeros(c.param.sizes(), c.param.options().dtype(c.state_dtype));
}

// The tensors of one ATen fused call: one param group, device and dtype (and
// for SGD whether the momentum buffers are new), and the part of those.
using BatchKey = std::tuple<size_t, c10::DeviceIndex, at::ScalarType, bool, int64_t>;

// The elements a fused call takes before the next part begins: master
// weights and stochastic rounding lay a call's tensors end to end with
// temporaries of up to a few dozen bytes an element, which a large model
// bounds this way (set_call_elements changes it for tests).
int64_t g_call_elements = int64_t{1} << 24;

// The batches of one step, split into parts whose parameters with master
// weights or stochastic rounding (the ones laid end to end) have at most
// g_call_elements elements (a larger tensor is a part alone).
template <class Batch>
class Batches {
 public:
  Batch& for_param(size_t group, const CachedParam& c, bool first) {
    const at::Tensor& p = c.param;
    const int64_t flat = c.master || c.stochastic ? p.numel() : 0;
    auto& fill = fill_[{group, p.device().index(), c.state_dtype, first, 0}];
    if (fill.second > 0 && fill.second + flat > g_call_elements) {
      ++fill.first;
      fill.second = 0;
    }
    fill.second += flat;
    return batches_[{group, p.device().index(), c.state_dtype, first, fill.first}];
  }
  std::map<BatchKey, Batch>& all() { return batches_; }

 private:
  std::map<BatchKey, Batch> batches_;
  std::map<BatchKey, std::pair<int64_t, int64_t>> fill_;  // (part, elements) by key of part 0
};

// A parameter's tensors in an ATen call: its own; with a master weight the
// float32 master and gradient; with stochastic rounding float32 copies of
// its tensors (made for all of them at once by join(), before the call, and
// written back after it).
struct AtenParams {
  std::vector<at::Tensor> params, grads;
  at::Tensor lr_tensor;  // the group's Fused::lr_tensor, else undefined (the options' lr)
  AtenMasters masters;
  std::vector<size_t> master_at;  // where each master goes in params and grads
  AtenRounding rounded;
  std::vector<size_t> rounded_at;  // where each rounded parameter goes
  // Where each rounded state tensor's copy goes: the list, the place in it,
  // the parameter's index in `rounded` and the tensor's in its state.
  struct StateAt {
    std::vector<at::Tensor>* list;
    size_t at, param, k;
  };
  std::vector<StateAt> rounded_states;
  void add(const CachedParam& c, size_t flat, const MasterWeights& masters_in,
           const at::Tensor& grad) {
    if (c.stochastic) {
      rounded.add(static_cast<int64_t>(flat), c.param, grad);
      rounded_at.push_back(params.size());
    } else if (c.master) {
      masters.add(c.param, master_storage(masters_in, c.param), grad);
      master_at.push_back(params.size());
    } else {
      params.push_back(c.param);
      grads.push_back(grad);
      return;
    }
    params.emplace_back();  // join() fills these in
    grads.emplace_back();
  }
  // A state tensor of the parameter added last onto `list`, as the call
  // takes it (float32 state, FusedOptions().state_dtype, as it is).
  void add_state(std::vector<at::Tensor>& list, const CachedParam& c, const at::Tensor& t) {
    if (c.stochastic && t.scalar_type() != at::kFloat) {
      const size_t k = rounded.add_state(t);
      rounded_states.push_back({&list, list.size(), rounded.size() - 1, k});
      list.emplace_back();  // join() fills it in
    } else {
      list.push_back(t);
    }
  }
  // Before the call: the float32 masters and copies in their places.
  void join() {
    if (!master_at.empty()) {
      masters.join();
      for (size_t i = 0; i < master_at.size(); ++i) {
        params[master_at[i]] = masters.master(i);
        grads[master_at[i]] = masters.grad32(i);
      }
    }
    if (!rounded_at.empty()) {
      rounded.join();
      for (size_t i = 0; i < rounded_at.size(); ++i) {
        params[rounded_at[i]] = rounded.param32(i);
        grads[rounded_at[i]] = rounded.grad32(i);
      }
      for (const StateAt& s : rounded_states) {
        (*s.list)[s.at] = rounded.state32(s.param, s.k);
      }
    }
  }
  // After write_back: the call's tensors let go (the flat buffers with
  // them), so that one part's are alive at a time.
  void release() {
    params.clear();
    grads.clear();
    masters = AtenMasters();
    master_at.clear();
    rounded = AtenRounding();
    rounded_at.clear();
    rounded_states.clear();
  }
  void write_back(const StepFlags& flags, const RoundingKeys& keys,
                  std::map<std::vector<int64_t>, at::Tensor>& layouts) const {
    const bool unscaled = flags.scale || flags.scale_on_device.defined();
    if (!master_at.empty()) {
      masters.write_back(unscaled);
    }
    if (!rounded_at.empty()) {
      rounded.write_back(keys, unscaled, layouts);
    }
  }
};

struct AdamBatch : AtenParams {
  std::vector<at::Tensor> exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
  double lr, beta1, beta2, weight_decay, eps;
  bool amsgrad;
  void release() {
    AtenParams::release();
    for (auto* list : {&exp_avgs, &exp_avg_sqs, &max_exp_avg_sqs, &steps}) {
      list->clear();
    }
  }
};

struct SgdBatch : AtenParams {
  std::vector<at::Tensor> buffers;
  double lr, momentum, dampening, weight_decay;
  bool nesterov, first;
  void release() {
    AtenParams::release();
    buffers.clear();
  }
};

// A group's Fused::lr_tensor, undefined where it has none.
at::Tensor lr_tensor_of(const detail::FusedState::Impl& f, size_t group) {
  return group < f.lr_tensors.size() ? f.lr_tensors[group] : at::Tensor();
}

// The learning rates torchamp's CPU kernels take in one step: a group's
// tensor's value where it has one (a CPU tensor, as its parameters: no sync),
// read once a step, not once a parameter; else the options' `lr`.
class HostRates {
 public:
  explicit HostRates(const detail::FusedState::Impl& f) : f_(f) {}
  double operator()(size_t group, double lr) {
    const at::Tensor t = lr_tensor_of(f_, group);
    if (!t.defined()) {
      return lr;
    }
    if (read_.size() <= group) {
      read_.resize(group + 1);
    }
    if (!read_[group]) {
      read_[group] = t.item<double>();
    }
    return *read_[group];
  }

 private:
  const detail::FusedState::Impl& f_;
  std::vector<c10::optional<double>> read_;
};

// The noise key of a stochastic job (kernels::rounding_key), 0 for others.
uint64_t noise_key(const StochasticRounding& rounding, const CachedParam& c, size_t flat) {
  return c.stochastic ? kernels::rounding_key(rounding.seed, rounding.updates, flat) : 0;
}

// The rounding count brought back to the host, where a device scaler's flags
// left it on the device: one read. The device's count stays the count: the
// flags' next steps, or a CUDA graph's replays, go on advancing it there.
void rounding_to_host(StochasticRounding& rounding) {
  if (rounding.stale) {
    rounding.updates = static_cast<uint64_t>(rounding.device_updates.item<int64_t>());
  }
}

// This step's noise keys for ATen's jobs (`params`: the optimizer's count of
// parameters) on each device that rounds, from the count where it is kept:
// under a device flag that was not read back, on the flag's device (made
// there; another device takes a copy, device to device); on the host, made
// on the host for CPU tensors and on another device from the count as a
// fill (no copy from the host: no sync).
class StepKeys {
 public:
  StepKeys(StochasticRounding& rounding, const StepFlags& flags, size_t params)
      : rounding_(rounding), flags_(flags), n_(static_cast<int64_t>(params)) {}
  RoundingKeys on(c10::Device device) {
    for (const auto& k : keys_) {
      if (k.first == device) {
        return k.second;
      }
    }
    keys_.emplace_back(device, make(device));
    return keys_.back().second;
  }

 private:
  RoundingKeys make(c10::Device device) {
    if (flags_.found_on_device.defined()) {
      if (!rounding_.device_updates.defined()) {
        rounding_.device_updates = at::full({}, static_cast<int64_t>(rounding_.updates),
                                            flags_.found_on_device.options().dtype(at::kLong));
      }
      const RoundingKeys k = rounding_keys(rounding_.seed, rounding_.device_updates, n_);
      return k.low.device() == device ? k : RoundingKeys{k.low.to(device), k.high.to(device)};
    }
    if (device.is_cpu()) {
      return rounding_keys(rounding_.seed, rounding_.updates, n_);
    }
    const at::Tensor count = at::full({}, static_cast<int64_t>(rounding_.updates),
                                      at::TensorOptions().dtype(at::kLong).device(device));
    return rounding_keys(rounding_.seed, count, n_);
  }
  StochasticRounding& rounding_;
  const StepFlags& flags_;
  int64_t n_;
  std::vector<std::pair<c10::Device, RoundingKeys>> keys_;
};

// Stochastic rounding keys its noise by the update count. Under a device
// flag the count is a tensor, which a captured graph's replays advance; on
// the host it would be frozen into the graph (every replay rounding with
// the captured step's noise), and bringing a device count back syncs, which
// capture refuses. Refused before anything changes.
void refuse_host_count_under_capture(const StepCache::Plan& plan,
                                     const StochasticRounding& rounding, const StepFlags& flags) {
  if (!compat::kCanCapture || !rounding.on || flags.found_on_device.defined()) {
    return;
  }
  for (const ReadyParam& r : plan.ready) {
    const CachedParam& c = plan.params[r.index];
    if (c.stochastic && c.param.is_cuda()) {
      TORCH_CHECK(!compat::capturing(c.param.device()),
                  "torchamp::optim: stochastic rounding while a CUDA graph is being captured "
                  "needs its update count on the GPU, which a step keeps there only under a "
                  "GradScaler whose state is on the device (a CUDA GradScaler, or "
                  "device_state(true)): with the count on the host every replay would round "
                  "with the captured step's noise. Step through such a scaler, or capture "
                  "without stochastic rounding. Nothing was changed.");
      return;  // one query: the step's parameters share the capture
    }
  }
}

// State made during a CUDA graph capture is made by the graph: its fill
// (zeros for Adam's moments, the step count on the device, a master
// weight's copy) is recorded and runs again at every replay, which would
// start the state over each time; a new SGD momentum buffer also reads the
// flag back, which capture refuses; and a stochastic-rounding count made on
// the device from the host's would start from that count at every replay.
// A step that would make any is refused before anything changes, naming the
// parameter. `makes` says what a CUDA parameter's step would make besides
// those two (null: nothing).
template <class Makes>
void refuse_new_state_under_capture(const StepCache::Plan& plan, const StochasticRounding& rounding,
                                    const StepFlags& flags, const Makes& makes) {
  if (!compat::kCanCapture) {
    return;
  }
  // One query, and the walk only while capturing (the lookups are host time
  // on every step otherwise): the step's parameters share the capture.
  const auto cuda = std::find_if(plan.ready.begin(), plan.ready.end(), [&](const ReadyParam& r) {
    return plan.params[r.index].param.is_cuda();
  });
  if (cuda == plan.ready.end() || !compat::capturing(plan.params[cuda->index].param.device())) {
    return;
  }
  const bool new_count = flags.found_on_device.defined() && !rounding.device_updates.defined();
  for (const ReadyParam& r : plan.ready) {
    const CachedParam& c = plan.params[r.index];
    if (!c.param.is_cuda()) {
      continue;
    }
    const char* what = c.master && r.master_data == nullptr ? "its master weight"
                       : c.stochastic && new_count ? "its stochastic-rounding count on the device"
                                                   : makes(r, c);
    TORCH_CHECK(what == nullptr, "torchamp::optim: param_groups[", c.group, "].params[", c.index,
                "] would get ", what,
                " while a CUDA graph is being captured: the graph would make it again at every "
                "replay. Run an eager step that is not skipped (an overflow skips it) through "
                "the same scaler before capturing: the warm-up capture needs anyway, and again "
                "after load(). Nothing was changed.");
  }
}

// After a step that rounded: the count moves on by one, or under a device
// flag by one where the flag is clear (the count stays on the device).
void count_rounded_update(StochasticRounding& rounding, const StepFlags& flags) {
  if (flags.found_on_device.defined()) {
    rounding.device_updates.add_(1).sub_(flags.found_on_device.to(at::kLong));
    rounding.stale = true;
  } else {
    ++rounding.updates;
    rounding.device_updates = at::Tensor();  // made again from this count when next needed
  }
}

// Before a step: a count the device holds comes back to the host when this
// step's flags are known there (once, at the change).
void settle_rounding(StochasticRounding& rounding, const StepFlags& flags) {
  if (rounding.stale && !flags.found_on_device.defined()) {
    rounding_to_host(rounding);
    rounding.stale = false;
    rounding.device_updates = at::Tensor();
  }
}

// The ATen batches' calls done, their masters and rounded copies written back.
template <class Batch, class Call>
void run_batches(Batches<Batch>& batches, StochasticRounding& rounding, const StepFlags& flags,
                 size_t params, bool cpu_rounded, Call call) {
  bool aten_rounded = false;
  for (const auto& kv : batches.all()) {
    aten_rounded = aten_rounded || kv.second.rounded.size() != 0;
  }
  StepKeys keys(rounding, flags, params);
  for (auto& kv : batches.all()) {
    Batch& b = kv.second;
    b.join();
    call(b);
    b.write_back(flags, b.rounded.size() != 0 ? keys.on(b.params.front().device()) : RoundingKeys{},
                 rounding.layouts);
    b.release();
  }
  if (cpu_rounded || aten_rounded) {
    count_rounded_update(rounding, flags);
  }
}

template <class Options, class State>
void adam_fused(torch::optim::Optimizer& opt, detail::FusedState::Impl& f, const AmpStepArgs& args,
                bool decoupled) {
  MasterWeights& masters = f.masters;
  StochasticRounding& rounding = f.rounding;
  StepCache::Plan& plan = ready_plan<State>(opt, f.cache, masters, f.rules(), adam_tensors<State>);
  StepFlags flags = read_flags(opt, args, f.aten_on_cpu);
  refuse_host_count_under_capture(plan, rounding, flags);
  refuse_new_state_under_capture(
      plan, rounding, flags, [&](const ReadyParam& r, const CachedParam& c) -> const char* {
        if (r.state == nullptr) {
          return "its Adam state";
        }
        const auto step = f.device_steps.find(c.param.unsafeGetTensorImpl());
        return step == f.device_steps.end() || step->second.state != r.state
                   ? "its step count on the device"
                   : nullptr;
      });
  if (flags.found_on_device.defined() && any_cpu_job(plan, f.aten_on_cpu)) {
    read_for_cpu_jobs(flags);
  }
  if (flags.skip) {  // as ATen's kernels with found_inf set: nothing changes
    return;
  }
  settle_rounding(rounding, flags);
  at::NoGradGuard no_grad;
  auto& state = opt.state();
  auto& groups = opt.param_groups();
  std::vector<kernels::AdamJob> jobs;
  HostRates host_lr(f);
  jobs.reserve(plan.ready.size());
  Batches<AdamBatch> batches;
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
    if (c.master && r.master_data == nullptr) {
      r.master_data = make_master(masters, c.param);
    }
    const at::Tensor& grad = *r.grad;
    if (takes_aten(p, f.aten_on_cpu)) {
      AdamBatch& b = batches.for_param(c.group, c, false);
      // Its count on the device, made from the state's before this step's.
      b.steps.push_back(device_step(f, c, &st, st.step()));
      // The device's count is the one ATen reads; the state's follows it
      // here where the host knows the step counts, and at save in any case
      // (sync_host_steps): a device flag decides on the device, and a CUDA
      // graph's replays advance the device's count alone.
      if (!flags.found_on_device.defined()) {
        st.step(st.step() + 1);
      }
      if (b.params.empty()) {
        b.lr = options.lr();
        b.lr_tensor = lr_tensor_of(f, c.group);
        b.beta1 = beta1;
        b.beta2 = beta2;
        b.weight_decay = options.weight_decay();
        b.eps = options.eps();
        b.amsgrad = options.amsgrad();
      }
      b.add(c, r.index, masters, grad);
      b.add_state(b.exp_avgs, c, st.exp_avg());
      b.add_state(b.exp_avg_sqs, c, st.exp_avg_sq());
      if (options.amsgrad()) {
        b.add_state(b.max_exp_avg_sqs, c, st.max_exp_avg_sq());
      }
      continue;
    }
    st.step(st.step() + 1);
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
    job.lr = host_lr(c.group, options.lr());
    job.beta1 = beta1;
    job.beta2 = beta2;
    job.eps = options.eps();
    job.weight_decay = options.weight_decay();
    job.step_size = job.lr / memo_bc1;
    job.bias_correction2_sqrt = memo_bc2_sqrt;
    job.decoupled = decoupled;
    job.stochastic = c.stochastic;
    job.float_state = c.stochastic && c.state_dtype == at::kFloat;
    job.noise_key = noise_key(rounding, c, r.index);
    jobs.push_back(job);
  }
  kernels::adam_step_cpu(jobs, flags.scale_ptr());
  run_batches(batches, rounding, flags, plan.params.size(), rounding.on && !jobs.empty(),
              [&](AdamBatch& b) {
                const c10::Device device = b.params.front().device();
                // As Python's fused Adam: the counts grow before the update
                // (ATen reads them with this step's) and shrink back by the
                // flag after it.
                at::_foreach_add_(b.steps, 1);
                const c10::optional<at::Tensor> found = found_inf_on(device, flags);
                compat::fused_adam(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs,
                                   b.steps, b.lr, b.lr_tensor, b.beta1, b.beta2, b.weight_decay,
                                   b.eps, b.amsgrad, decoupled, grad_scale_on(device, flags),
                                   found);
                if (found) {
                  at::_foreach_sub_(b.steps, std::vector<at::Tensor>(b.steps.size(), *found));
                }
              });
}

// SGD's fused update (torchamp's kernels on the CPU, ATen's fused op on
// CUDA), beside adam_fused.
void sgd_fused(torch::optim::Optimizer& opt, detail::FusedState::Impl& f, const AmpStepArgs& args) {
  MasterWeights& masters = f.masters;
  StochasticRounding& rounding = f.rounding;
  StepCache::Plan& plan =
      ready_plan<torch::optim::SGDParamState>(opt, f.cache, masters, f.rules(), sgd_tensors);
  StepFlags flags = read_flags(opt, args, f.aten_on_cpu);
  refuse_host_count_under_capture(plan, rounding, flags);
  refuse_new_state_under_capture(
      plan, rounding, flags, [&](const ReadyParam& r, const CachedParam&) {
        return makes_momentum_buffer(opt, plan, r) ? "its momentum buffer" : nullptr;
      });
  if (flags.found_on_device.defined() &&
      (any_cpu_job(plan, f.aten_on_cpu) || new_momentum_buffers(opt, plan))) {
    // A new momentum buffer takes the first direction only if the step is
    // not skipped: the flag is read back, once in a parameter's life.
    read_for_cpu_jobs(flags);
  }
  if (flags.skip) {  // as ATen's kernels with found_inf set: nothing changes
    return;
  }
  settle_rounding(rounding, flags);
  at::NoGradGuard no_grad;
  std::vector<kernels::SgdJob> jobs;
  HostRates host_lr(f);
  jobs.reserve(plan.ready.size());
  Batches<SgdBatch> batches;
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
      r.master_data = make_master(masters, c.param);
    }
    const at::Tensor& grad = *r.grad;
    if (takes_aten(p, f.aten_on_cpu)) {
      SgdBatch& b = batches.for_param(c.group, c, first);
      if (b.params.empty()) {
        b.lr = options.lr();
        b.lr_tensor = lr_tensor_of(f, c.group);
        b.momentum = options.momentum();
        b.dampening = options.dampening();
        b.weight_decay = options.weight_decay();
        b.nesterov = options.nesterov();
        b.first = first;
      }
      b.add(c, r.index, masters, grad);
      if (buffer.defined()) {
        b.add_state(b.buffers, c, buffer);
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
    job.lr = host_lr(c.group, options.lr());
    job.momentum = options.momentum();
    job.dampening = options.dampening();
    job.weight_decay = options.weight_decay();
    job.nesterov = options.nesterov();
    job.stochastic = c.stochastic;
    job.float_state = c.stochastic && c.state_dtype == at::kFloat;
    job.noise_key = noise_key(rounding, c, r.index);
    jobs.push_back(job);
  }
  kernels::sgd_step_cpu(jobs, flags.scale_ptr());
  run_batches(batches, rounding, flags, plan.params.size(), rounding.on && !jobs.empty(),
              [&](SgdBatch& b) {
                const c10::Device device = b.params.front().device();
                compat::fused_sgd(b.params, b.grads, b.buffers, b.weight_decay, b.momentum, b.lr,
                                  b.lr_tensor, b.dampening, b.nesterov, b.first,
                                  grad_scale_on(device, flags), found_inf_on(device, flags));
              });
}

}  // namespace

int64_t call_elements() {
  return g_call_elements;
}

void set_call_elements(int64_t elements) {
  TORCH_CHECK_VALUE(elements > 0, "set_call_elements: ", elements, " is not positive");
  g_call_elements = elements;
}

void sync_host_steps(torch::optim::Optimizer& opt, detail::FusedState::Impl& f) {
  rounding_to_host(f.rounding);
  auto& state = opt.state();
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const auto entry = f.device_steps.find(p.unsafeGetTensorImpl());
      if (entry == f.device_steps.end()) {
        continue;
      }
      const auto it = state.find(compat::optim_state_key(state, p));
      if (it == state.end() || it->second.get() != entry->second.state) {
        continue;
      }
      const auto count = static_cast<int64_t>(entry->second.step.item<float>());
      if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
        adam->step(count);
      } else if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
        adamw->step(count);
      }
    }
  }
}

void sgd_update(torch::optim::SGD& opt, detail::FusedState::Impl& f, const AmpStepArgs& args) {
  sgd_fused(opt, f, args);
}

void adam_update(torch::optim::Adam& opt, detail::FusedState::Impl& f, const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamOptions, torch::optim::AdamParamState>(opt, f, args, false);
}

void adamw_update(torch::optim::AdamW& opt, detail::FusedState::Impl& f, const AmpStepArgs& args) {
  adam_fused<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt, f, args, true);
}

}  // namespace optim
}  // namespace torchamp
