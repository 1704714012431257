// The fused optimizers: one template, Fused<Base>, over LibTorch's SGD, Adam
// and AdamW (torchamp/optim.h), instantiated here for the three.

#include <torchamp/optim.h>

#include "autocast/cpu_dtype.h"
#include "compat/capture.h"
#include "optim/updates.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/full.h>

#include <memory>
#include <string>
#include <utility>

namespace torchamp {
namespace optim {

detail::FusedState::FusedState(const FusedOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
detail::FusedState::~FusedState() = default;

namespace {

// As the base classes' step: the closure (if any) runs with grad mode on, the
// update without.
template <class Self, class Base>
at::Tensor fused_or_base_step(Self& self, torch::optim::Optimizer::LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  if (self.prepare_amp_step()) {
    self.amp_step(AmpStepArgs());
  } else {
    self.Base::step(nullptr);
  }
  return loss;
}

// What differs between the three: the per-parameter state's type and
// tensors (for the step's walk), and the update.
template <class Base, class ParamState,
          void (*kUpdate)(Base&, detail::FusedState::Impl&, const AmpStepArgs&),
          StateTensors (*kTensors)(const ParamState&)>
struct UpdateOf {
  using State = ParamState;
  static StateTensors tensors(const State& s) { return kTensors(s); }
  static void step(Base& opt, detail::FusedState::Impl& f, const AmpStepArgs& args) {
    kUpdate(opt, f, args);
  }
};

template <class Base>
struct Update;
template <>
struct Update<torch::optim::SGD>
    : UpdateOf<torch::optim::SGD, torch::optim::SGDParamState, sgd_update, sgd_tensors> {};
template <>
struct Update<torch::optim::Adam>
    : UpdateOf<torch::optim::Adam, torch::optim::AdamParamState, adam_update,
               adam_tensors<torch::optim::AdamParamState>> {};
template <>
struct Update<torch::optim::AdamW>
    : UpdateOf<torch::optim::AdamW, torch::optim::AdamWParamState, adamw_update,
               adam_tensors<torch::optim::AdamWParamState>> {};

// Half-precision CPU parameters put the model's CPU matmuls in their dtype:
// the one-time warning where this CPU is slow at it, checked at the first
// step (a model may be cast after its optimizer was made).
void warn_on_half_cpu_params(const torch::optim::Optimizer& opt, detail::FusedState::Impl& f) {
  if (f.dtypes_checked) {
    return;
  }
  f.dtypes_checked = true;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.is_cpu()) {
        torchamp::detail::warn_if_slow_on_cpu(
            p.scalar_type(), "a model with half-precision parameters (given to torchamp::optim)");
      }
    }
  }
}

// torchamp's options against each other and the parameters, before the
// optimizer exists (a model cast later is checked at its step).
void check_fused_options(const torch::optim::Optimizer& opt, const FusedOptions& fused) {
  TORCH_CHECK_NOT_IMPLEMENTED(!fused.aten_kernels() || compat::kAtenFusedOptimizers,
                              "torchamp::optim: FusedOptions().aten_kernels(true) needs ATen's "
                              "fused optimizer ops, LibTorch 2.4 or later; this is ",
                              compat::runtime_torch_version(), ".");
  const auto state = fused.state_dtype();
  TORCH_CHECK_VALUE(!state || *state == at::kFloat || *state == at::kBFloat16,
                    "torchamp::optim: FusedOptions().state_dtype(", state ? *state : at::kFloat,
                    "): the state of a stochastically rounded parameter is BFloat16 or Float; "
                    "nothing was changed.");
  TORCH_CHECK_VALUE(!state || fused.stochastic_rounding(),
                    "torchamp::optim: FusedOptions().state_dtype(", state ? *state : at::kFloat,
                    ") without stochastic_rounding(true): it sets the state's dtype of "
                    "stochastically rounded parameters (master weights keep float32 state, other "
                    "parameters their own dtype's); nothing was changed.");
  if (!fused.stochastic_rounding()) {
    return;
  }
  TORCH_CHECK_VALUE(!fused.master_weights(),
                    "torchamp::optim: FusedOptions().stochastic_rounding(true) together with "
                    "master_weights(true): stochastic rounding replaces the float32 masters; "
                    "choose one.");
  const auto& groups = opt.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params().size(); ++i) {
      if (groups[g].params()[i].scalar_type() != at::kBFloat16) {
        refuse_stochastic(g, i, groups[g].params()[i]);
      }
    }
  }
}

}  // namespace

template <class Base>
Fused<Base>::Fused(std::vector<torch::optim::OptimizerParamGroup> param_groups, Options defaults,
                   FusedOptions fused)
    : Base(std::move(param_groups), std::move(defaults)), fused_(fused) {
  check_fused_options(*this, fused);
}

template <class Base>
Fused<Base>::Fused(std::vector<at::Tensor> params, Options defaults, FusedOptions fused)
    : Base(std::move(params), std::move(defaults)), fused_(fused) {
  check_fused_options(*this, fused);
}

template <class Base>
Fused<Base>::~Fused() = default;

namespace {

// While a CUDA graph is being captured only device work is recorded: a CPU
// parameter's update (torchamp's kernels, or ATen's CPU ops) would run once,
// at the capture, and never on a replay. Refused before anything changes.
void refuse_cpu_updates_under_capture(const torch::optim::Optimizer& opt) {
  if (!compat::kCanCapture) {  // no walk over the parameters where nothing captures
    return;
  }
  c10::optional<c10::Device> gpu;
  std::string cpu;
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& params = opt.param_groups()[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) {
        continue;
      }
      if (params[i].is_cuda() && !gpu) {
        gpu = params[i].device();
      } else if (params[i].is_cpu() && cpu.empty()) {
        cpu = "param_groups[" + std::to_string(g) + "].params[" + std::to_string(i) + "]";
      }
    }
  }
  TORCH_CHECK(cpu.empty() || !gpu || !compat::capturing(*gpu), "torchamp::optim: ", cpu,
              " is a CPU tensor while a CUDA graph is being captured: its update would run on "
              "the host once, at the capture, and not on a replay. Keep every parameter of a "
              "captured step on the GPU.");
}

}  // namespace

template <class Base>
at::Tensor Fused<Base>::step(torch::optim::Optimizer::LossClosure closure) {
  refuse_cpu_updates_under_capture(*this);
  warn_on_half_cpu_params(*this, fused_.impl());
  return fused_or_base_step<Fused, Base>(*this, std::move(closure));
}

template <class Base>
bool Fused<Base>::supports_amp_scaling() const {
  const auto& f = fused_.impl();
  return can_fuse<typename Update<Base>::State>(*this, f.rules(), Update<Base>::tensors);
}

template <class Base>
bool Fused<Base>::prepare_amp_step() {
  auto& f = fused_.impl();
  return prepare<typename Update<Base>::State>(*this, f.cache.plan(), f.masters, f.rules(),
                                               Update<Base>::tensors);
}

template <class Base>
void Fused<Base>::amp_step(const AmpStepArgs& args) {
  refuse_cpu_updates_under_capture(*this);
  warn_on_half_cpu_params(*this, fused_.impl());
  Update<Base>::step(*this, fused_.impl(), args);
}

template <class Base>
void Fused<Base>::fused_step_counts_to_host() {
  sync_host_steps(*this, fused_.impl());
}

template <class Base>
void Fused<Base>::save(torch::serialize::OutputArchive& archive) const {
  // The counts a device scaler's steps left on the device: the state's own
  // (a cache of them, brought up to date), so saving changes nothing a
  // caller can observe but the counts becoming current. LibTorch's save()
  // is const: this is the one const member that writes, and only those.
  auto& self = const_cast<Fused&>(*this);
  sync_host_steps(self, self.fused_.impl());
  // Likewise the learning rates a group reads from its lr_tensor (one read each).
  const auto& lrs = fused_.impl().lr_tensors;
  for (size_t g = 0; g < lrs.size(); ++g) {
    if (lrs[g].defined()) {
      static_cast<Options&>(self.param_groups()[g].options()).lr(lrs[g].template item<double>());
    }
  }
  Base::save(archive);
  save_masters(*this, fused_.impl().masters, archive);
  save_rounding(fused_.impl().rounding, archive);
}

template <class Base>
void Fused<Base>::load(torch::serialize::InputArchive& archive) {
  auto& f = fused_.impl();
  auto loaded = read_masters(*this, f.masters, archive);
  const StochasticRounding rounding = read_rounding(f.rounding, archive);
  Base::load(archive);
  f.rounding = rounding;
  f.rounding.device_updates = at::Tensor();  // made again from the loaded count
  f.rounding.stale = false;
  f.masters.store().entries = std::move(loaded);
  ++f.masters.store().version;
  f.cache = StepCache();
  f.device_steps.clear();  // made again from the loaded counts
  for (size_t g = 0; g < f.lr_tensors.size() && g < this->param_groups().size(); ++g) {
    if (f.lr_tensors[g].defined()) {  // the loaded rate, in the same tensor
      f.lr_tensors[g].fill_(static_cast<const Options&>(this->param_groups()[g].options()).lr());
    }
  }
}

template <class Base>
at::Tensor Fused<Base>::lr_tensor(size_t group) {
  auto& groups = this->param_groups();
  TORCH_CHECK_INDEX(group < groups.size(), "lr_tensor: param group ", group, " does not exist (",
                    groups.size(), " groups)");
  auto& lrs = fused_.impl().lr_tensors;
  if (lrs.size() < groups.size()) {
    lrs.resize(groups.size());
  }
  if (!lrs[group].defined()) {
    const auto& params = groups[group].params();
    const c10::Device device = params.empty() ? c10::Device(c10::kCPU) : params.front().device();
    lrs[group] = at::full({}, static_cast<const Options&>(groups[group].options()).lr(),
                          at::TensorOptions().dtype(at::kFloat).device(device));
  }
  return lrs[group];
}

template <class Base>
FusedOptions Fused<Base>::fused_options() const {
  const auto& f = fused_.impl();
  return FusedOptions()
      .master_weights(f.masters.on())
      .stochastic_rounding(f.rounding.on)
      .seed(f.rounding.seed)
      .state_dtype(f.float_state ? c10::optional<at::ScalarType>(at::kFloat) : c10::nullopt)
      .aten_kernels(f.aten_on_cpu);
}

template <class Base>
at::Tensor Fused<Base>::master_weight(const at::Tensor& param) const {
  return master_value(fused_.impl().masters, param);
}

template <class Base>
at::Tensor Fused<Base>::master_weight_storage(const at::Tensor& param) const {
  return master_storage(fused_.impl().masters, param);
}

namespace {

// Every name of one module is the other's too, with the same shape: checked
// before anything is copied.
void check_same_names(const torch::OrderedDict<std::string, at::Tensor>& from,
                      const torch::OrderedDict<std::string, at::Tensor>& to, const char* what) {
  for (const auto& item : from) {
    const at::Tensor* twin = to.find(item.key());
    TORCH_CHECK_VALUE(twin != nullptr, "export_float32: the target module has no ", what, " '",
                      item.key(), "'");
    TORCH_CHECK_VALUE(twin->sizes() == item.value().sizes(), "export_float32: ", what, " '",
                      item.key(), "' has shape ", item.value().sizes(),
                      " in the source module and ", twin->sizes(), " in the target");
  }
  for (const auto& item : to) {
    TORCH_CHECK_VALUE(from.contains(item.key()), "export_float32: the source module has no ", what,
                      " '", item.key(), "'");
  }
}

}  // namespace

template <class Base>
void Fused<Base>::export_float32(const torch::nn::Module& from, torch::nn::Module& to) const {
  const auto params = from.named_parameters(), target_params = to.named_parameters();
  const auto buffers = from.named_buffers(), target_buffers = to.named_buffers();
  check_same_names(params, target_params, "parameter");
  check_same_names(buffers, target_buffers, "buffer");
  if (&from == &to) {
    return;
  }
  at::NoGradGuard no_grad;
  for (const auto& item : params) {
    const at::Tensor master = master_weight(item.value());
    target_params[item.key()].copy_(master.defined() ? master : item.value());
  }
  for (const auto& item : buffers) {
    target_buffers[item.key()].copy_(item.value());
  }
}

template class Fused<torch::optim::SGD>;
template class Fused<torch::optim::Adam>;
template class Fused<torch::optim::AdamW>;

}  // namespace optim
}  // namespace torchamp
