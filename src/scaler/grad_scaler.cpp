// GradScaler's stage machine: per optimizer ready -> unscaled -> stepped,
// the skip decision and the hand-over to an optimizer that unscales in its
// own step. The gradient cache is grad_cache.cpp, the general per-device
// unscale unscale.cpp, the state dict grad_scaler_state.cpp.

#include <torchamp/grad_scaler.h>

#include "compat/capture.h"
#include "compat/compat.h"
#include "scaler/grad_cache.h"
#include "scaler/unscale.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace torchamp {

StepResult StepResult::pending(at::Tensor value, at::Tensor found_inf) {
  StepResult result(std::move(value));
  result.found_inf_ = std::move(found_inf);
  return result;
}

bool StepResult::has_value() const {
  if (!skipped_) {
    skipped_ = !value_.has_value() || (found_inf_.defined() && found_inf_.item<float>() != 0.0f);
  }
  return !*skipped_;
}

const at::Tensor& StepResult::value() const {
  if (!has_value()) {
    throw std::bad_optional_access();
  }
  return *value_;
}

StepResult::operator std::optional<at::Tensor>() const {
  return has_value() ? value_ : std::nullopt;
}

GradScaler::GradScaler(GradScalerOptions options)
    : schedule_(options.init_scale(), options.growth_factor(), options.backoff_factor(),
                options.growth_interval(), options.backoff_interval(), options.dynamic(),
                options.min_scale()),
      init_scale_(options.init_scale()),
      enabled_(options.enabled()),
      max_consecutive_skips_(options.max_consecutive_skips()),
      unscale_float16_(options.unscale_float16()),
      device_state_(options.device_state()) {
  ScaleSchedule::check_tracker(options.max_consecutive_skips(), "max_consecutive_skips");
}

GradScalerOptions GradScaler::options() const {
  host_();
  return GradScalerOptions()
      .init_scale(init_scale_)
      .growth_factor(schedule_.growth_factor())
      .backoff_factor(schedule_.backoff_factor())
      .growth_interval(schedule_.growth_interval())
      .backoff_interval(schedule_.backoff_interval())
      .dynamic(schedule_.dynamic())
      .enabled(enabled_)
      .min_scale(schedule_.min_scale())
      .max_consecutive_skips(max_consecutive_skips_)
      .unscale_float16(unscale_float16_)
      .device_state(device_state_);
}

// A scaler whose state lives on a device: made at the first tensor that is
// not on the CPU (or the first with device_state), from the host values.
bool GradScaler::on_device_(c10::Device device) {
  if (device_) {
    return true;
  }
  if (device.is_cpu() && !device_state_) {
    return false;
  }
  const at::TensorOptions on = at::TensorOptions().device(device);
  OnDevice d;
  d.scale = at::full({}, schedule_.scale(), on.dtype(at::kFloat));
  d.growth = at::full({}, schedule_.growth_tracker(), on.dtype(at::kInt));
  d.backoff = at::full({}, schedule_.backoff_tracker(), on.dtype(at::kInt));
  d.skips = at::full({}, consecutive_skips_, on.dtype(at::kLong));
  d.tracker_below_interval =
      schedule_.growth_tracker() < schedule_.growth_interval() && schedule_.backoff_tracker() == 0;
  device_ = std::move(d);
  return true;
}

const ScaleSchedule& GradScaler::host_() const {
  if (device_) {
    schedule_.restore({device_->scale.item<float>(), device_->growth.item<int64_t>(),
                       device_->backoff.item<int64_t>()});
    consecutive_skips_ = device_->skips.item<int64_t>();
  }
  return schedule_;
}

void GradScaler::write_device_() {
  if (!device_) {
    return;
  }
  device_->scale.fill_(schedule_.scale());
  device_->growth.fill_(schedule_.growth_tracker());
  device_->backoff.fill_(schedule_.backoff_tracker());
  device_->skips.fill_(consecutive_skips_);
  device_->tracker_below_interval =
      schedule_.growth_tracker() < schedule_.growth_interval() && schedule_.backoff_tracker() == 0;
}

at::Tensor GradScaler::scale(const at::Tensor& output) {
  TORCH_CHECK_VALUE(output.defined(), "GradScaler::scale: the output tensor is undefined");
  if (!is_enabled()) {
    return output;
  }
  if (on_device_(output.device())) {  // Python's outputs * self._scale.to(outputs.device)
    return output.mul(device_->scale.to(output.device()));
  }
  // Python multiplies by its 0-dim float32 scale tensor. A 0-dim CPU tensor
  // does the same on any device (ATen reads it as a scalar, in float32 for
  // reduced-precision outputs); a C++ Scalar would round the scale to a
  // bfloat16/float16 output's dtype first.
  return output.mul(at::scalar_tensor(schedule_.scale(), at::TensorOptions().dtype(at::kFloat)));
}

std::vector<at::Tensor> GradScaler::scale(const std::vector<at::Tensor>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK_VALUE(outputs[i].defined(), "GradScaler::scale: outputs[", i, "] is undefined");
  }
  std::vector<at::Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const auto& output : outputs) {
    scaled.push_back(scale(output));
  }
  return scaled;
}

namespace {

// PyTorch: inv_scale = scale.double().reciprocal().float()
float inverse(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

// The device of the first gradient off the CPU; none: all on the CPU.
std::optional<c10::Device> first_off_cpu(const std::vector<detail::GradRef>& grads) {
  for (const detail::GradRef& ref : grads) {
    if (!ref.param.grad().device().is_cpu()) {
      return ref.param.grad().device();
    }
  }
  return std::nullopt;
}

}  // namespace

NonFiniteGradient GradScaler::named_(size_t group, size_t index, const at::Tensor& param) const {
  auto name = parameter_names_.find(param.unsafeGetTensorImpl());
  return {group, index, name == parameter_names_.end() ? std::string() : name->second};
}

void GradScaler::record_(const torch::optim::Optimizer& optimizer, OptimizerState& state,
                         std::optional<bool> agreed, std::vector<NonFiniteGradient> report) {
  state.checked = true;
  state.found_inf = agreed ? *agreed : !report.empty();
  last_non_finite_[&optimizer] = std::move(report);
}

bool GradScaler::unscale_grads_(torch::optim::Optimizer& optimizer, OptimizerState& state,
                                bool unscale, double* sum_squares) {
  TORCH_INTERNAL_ASSERT(sum_squares == nullptr || !unscale);
  if (device_ || device_state_) {
    TORCH_INTERNAL_ASSERT(sum_squares == nullptr, "clip_grad_norm_ chose the host path");
    return unscale_on_device_(optimizer, state, unscale);
  }
  const std::optional<float> inv_scale =
      unscale ? std::optional<float>(inverse(schedule_.scale())) : std::nullopt;
  // float16 gradients: checked for an optimizer that takes the scale (Python's
  // allow_fp16 on the fused path), unscaled only with the option on.
  const bool allow_fp16 = !unscale || unscale_float16_;
  // With a reducer, ranks agree first (a read-only pass, then one collective),
  // so a failed collective leaves every gradient and stage as it was.
  std::optional<bool> agreed;
  detail::GradCache& cache = grad_caches_.map().caches[&optimizer];
  if (!detail::refresh_cache(cache, optimizer)) {
    cache = detail::build_cache(optimizer);
  }
  // Every gradient a dense, contiguous CPU tensor: nothing can throw.
  if (cache.valid && (allow_fp16 || !cache.has_half)) {
    bool any = false;
    bool checked = false;  // the flags are this step's
    if (sum_squares != nullptr) {
      any = cache.spans.check_sum_squares(sum_squares);
      checked = true;
    }
    if (found_inf_reducer_) {
      if (!checked) {
        any = cache.spans.run(/*write=*/false, 1.0f);
        checked = true;
      }
      agreed = found_inf_reducer_(any, c10::Device(c10::kCPU));
    }
    if (cache.grads == 0) {
      return false;
    }
    const bool write = inv_scale.has_value() && *inv_scale != 1.0f;
    if (write || !checked) {  // a check pass already gave the flags when nothing is written
      any = cache.spans.run(write, inv_scale.value_or(1.0f));
    }
    std::vector<NonFiniteGradient> report;
    for (size_t s = 0; any && s < cache.spans.size(); ++s) {
      if (cache.spans.found(s)) {
        const detail::GradCache::Entry& e = cache.entries[cache.span_of[s]];
        report.push_back(
            named_(e.group, e.index, optimizer.param_groups()[e.group].params()[e.index]));
      }
    }
    record_(optimizer, state, agreed, std::move(report));
    return true;
  }

  const std::vector<detail::GradRef> grads =
      detail::checked_grads(optimizer, allow_fp16);  // throws before any change
  if (first_off_cpu(grads)) {
    TORCH_INTERNAL_ASSERT(sum_squares == nullptr, "clip_grad_norm_ chose the host path");
    return unscale_on_device_(optimizer, state, unscale);  // the scaler's state moves there
  }
  at::NoGradGuard no_grad;
  detail::Buckets buckets = detail::bucket_grads(grads);
  if (found_inf_reducer_) {
    const bool local = detail::any_of(detail::unscale_buckets(buckets, grads.size(), std::nullopt));
    agreed = found_inf_reducer_(
        local, grads.empty() ? c10::Device(c10::kCPU) : grads.front().param.grad().device());
  }
  if (grads.empty()) {
    return false;
  }
  const std::vector<uint8_t> found = detail::unscale_buckets(buckets, grads.size(), inv_scale);
  if (sum_squares != nullptr) {
    *sum_squares = detail::sum_squares(grads);
  }
  std::vector<NonFiniteGradient> report;
  for (size_t r = 0; r < grads.size(); ++r) {
    if (found[r] != 0) {
      report.push_back(named_(grads[r].group, grads[r].index, grads[r].param));
    }
  }
  record_(optimizer, state, agreed, std::move(report));
  return true;
}

bool GradScaler::unscale_on_device_(torch::optim::Optimizer& optimizer, OptimizerState& state,
                                    bool unscale, at::Tensor* norm) {
  const bool allow_fp16 = !unscale || unscale_float16_;
  const std::vector<detail::GradRef> grads =
      detail::checked_grads(optimizer, allow_fp16);  // throws before any change
  at::NoGradGuard no_grad;
  if (grads.empty()) {
    if (found_inf_reducer_) {  // as the host path: this rank still takes part
      found_inf_reducer_(false, device_ ? device_->scale.device() : c10::Device(c10::kCPU));
    }
    return false;
  }
  // The state's device: the first gradient's off the CPU (a host scaler
  // comes here for one), or the CPU with device_state.
  const c10::Device device = first_off_cpu(grads).value_or(grads.front().param.grad().device());
  const bool moved = on_device_(device);
  TORCH_INTERNAL_ASSERT(moved, "the scaler's state did not move to ", device);
  check_capturable_(unscale ? "unscale_" : "step", false);
  const c10::Device home = device_->scale.device();
  // Python: inv_scale = scale.double().reciprocal().float()
  const at::Tensor inv =
      unscale ? device_->scale.to(at::kDouble).reciprocal().to(at::kFloat) : at::Tensor();
  std::vector<at::Tensor> found;
  if (found_inf_reducer_) {
    // Ranks agree first (a check pass, the flags read back, one collective),
    // so a failed collective leaves every gradient as it was.
    found = detail::unscale_on_devices(grads, at::Tensor());
    bool any = false;
    for (const at::Tensor& flag : found) {
      any = any || flag.item<float>() != 0.0f;
    }
    const bool agreed = found_inf_reducer_(any, home);
    if (unscale) {
      found = detail::unscale_on_devices(grads, inv);
    }
    for (at::Tensor& flag : found) {
      flag.fill_(agreed ? 1.0f : 0.0f);
    }
  } else {
    found = detail::unscale_on_devices(grads, inv);
  }
  if (norm != nullptr) {  // the real gradients' norm: the scaled ones' over the scale
    *norm = detail::sum_squares_on(grads, home)
                .sqrt()
                .div(device_->scale.to(at::kDouble))
                .to(at::kFloat);
  }
  state.checked = true;
  state.found_on = std::move(found);
  std::vector<CheckedParam> checked;
  checked.reserve(grads.size());
  for (const detail::GradRef& ref : grads) {
    checked.push_back({ref.group, ref.index, ref.param});
  }
  last_checked_[&optimizer] = std::move(checked);
  last_non_finite_.erase(&optimizer);
  return true;
}

at::Tensor GradScaler::found_total_(const OptimizerState& state) const {
  const c10::Device home = device_->scale.device();
  if (state.found_on.empty()) {  // checked on the host before the state moved
    return at::full({}, state.found_inf ? 1.0f : 0.0f,
                    at::TensorOptions().dtype(at::kFloat).device(home));
  }
  at::Tensor total = state.found_on.front().to(home);
  for (size_t i = 1; i < state.found_on.size(); ++i) {
    total = total.add(state.found_on[i].to(home));
  }
  // ATen's fused kernels skip only where the flag is exactly 1, and Adam's
  // step counts go back by it: two devices' overflows must not make 2.
  // (Python's GradScaler hands them the sum, and updates a two-device
  // optimizer with inf/NaN gradients then.)
  return state.found_on.size() > 1 ? total.clamp_max_(1.0f) : total;
}

std::vector<NonFiniteGradient> GradScaler::non_finite_gradients(
    const torch::optim::Optimizer& optimizer) const {
  auto checked = last_checked_.find(&optimizer);
  if (checked != last_checked_.end()) {  // a device scaler: found now, one read per gradient
    std::vector<NonFiniteGradient> report;
    for (const CheckedParam& c : checked->second) {
      const at::Tensor& grad = c.param.grad();
      if (!grad.defined()) {
        continue;
      }
      const at::Tensor values = grad.is_sparse() ? grad.coalesce()._values() : grad;
      if (!at::isfinite(values).all().item<bool>()) {
        report.push_back(named_(c.group, c.index, c.param));
      }
    }
    return report;
  }
  auto it = last_non_finite_.find(&optimizer);
  return it == last_non_finite_.end() ? std::vector<NonFiniteGradient>() : it->second;
}

void GradScaler::register_parameter_name(const std::string& name, const at::Tensor& parameter) {
  TORCH_CHECK_VALUE(parameter.defined(), "register_parameter_name: the parameter '", name,
                    "' is undefined");
  parameter_names_[parameter.unsafeGetTensorImpl()] = name;
}

std::string GradScaler::describe_non_finite(const torch::optim::Optimizer& optimizer) const {
  const auto list = non_finite_gradients(optimizer);
  if (list.empty()) {
    return "none on this rank (another rank's, agreed over the process group)";
  }
  std::string out;
  for (size_t i = 0; i < list.size() && i < 10; ++i) {
    out += (i ? ", " : "") + detail::param_name(list[i].group, list[i].index);
    if (!list[i].name.empty()) {
      out += " '" + list[i].name + "'";
    }
  }
  if (list.size() > 10) {
    out += " and " + std::to_string(list.size() - 10) + " more";
  }
  return out;
}

void GradScaler::check_ready_for_unscale_(const torch::optim::Optimizer& optimizer) const {
  auto it = per_optimizer_.find(&optimizer);
  if (it != per_optimizer_.end()) {
    TORCH_CHECK(it->second.stage != Stage::kUnscaled,
                "unscale_() has already been called on this optimizer since the last update().");
    TORCH_CHECK(it->second.stage != Stage::kStepped, "unscale_() is being called after step().");
  }
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    return;
  }
  check_ready_for_unscale_(optimizer);
  OptimizerState state;
  unscale_grads_(optimizer, state, /*unscale=*/true);  // no state is stored if this throws
  state.stage = Stage::kUnscaled;
  per_optimizer_[&optimizer] = std::move(state);
}

StepResult GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    return optimizer.step();
  }
  auto it = per_optimizer_.find(&optimizer);
  // Python's _step_supports_amp_scaling: the optimizer takes the scale.
  auto* amp = dynamic_cast<StepSupportsAmpScaling*>(&optimizer);
  if (amp != nullptr && !amp->prepare_amp_step()) {
    amp = nullptr;
  }
  check_capturable_("step", amp == nullptr || !amp->takes_device_args());
  if (it == per_optimizer_.end()) {  // ready: unscale here, or only check for amp_step
    OptimizerState state;
    state.deferred = amp != nullptr;
    TORCH_CHECK(unscale_grads_(optimizer, state, /*unscale=*/!state.deferred),
                "No inf checks were recorded for this optimizer.");
    state.stage = Stage::kUnscaled;
    it = per_optimizer_.emplace(&optimizer, std::move(state)).first;
  }
  OptimizerState& state = it->second;
  TORCH_CHECK(state.stage != Stage::kStepped,
              "step() has already been called since the last update().");
  TORCH_CHECK(state.checked, "No inf checks were recorded for this optimizer.");
  // On a device scaler the flag is a tensor there: read back only where a
  // caller needs it on the host (the skip limit, an optimizer that takes
  // host values, one that does not take the scale: Python's _maybe_opt_step).
  const bool on_device = !state.found_on.empty();
  const at::Tensor found = on_device ? found_total_(state) : at::Tensor();
  if (on_device && max_consecutive_skips_ > 0) {
    state.found_inf = found.item<float>() != 0.0f;
    host_();
  }
  const int64_t max_skips = max_consecutive_skips_;
  TORCH_CHECK(!state.found_inf || max_skips == 0 || consecutive_skips_ + 1 < max_skips,
              "GradScaler: ", consecutive_skips_ + 1,
              " steps in a row were skipped because gradients held inf/NaN "
              "(max_consecutive_skips = ",
              max_skips, "); training is not progressing. Current scale: ", schedule_.scale(),
              " (min_scale ", schedule_.min_scale(),
              "). Non-finite gradients in this step: ", describe_non_finite(optimizer),
              ". Look for a NaN in the data or the loss, a learning rate that diverged, or a "
              "float16 overflow in the forward pass.");
  StepResult result;
  if (on_device) {
    if (amp != nullptr) {
      AmpStepArgs args;
      at::Tensor grad_scale;
      if (state.deferred) {  // a clip coefficient divides the scale, as below
        grad_scale =
            state.clip_coef_on.defined() ? device_->scale.div(state.clip_coef_on) : device_->scale;
      }
      if (amp->takes_device_args()) {
        args.found_inf_tensor = found;
        args.grad_scale_tensor = grad_scale;
      } else {  // an optimizer written for host values: one read back
        args.found_inf = found.item<float>() != 0.0f;
        if (grad_scale.defined()) {
          args.grad_scale = grad_scale.item<float>();
        }
      }
      amp->amp_step(args);
      result = StepResult::pending(at::Tensor(), found);
    } else if (found.item<float>() == 0.0f) {
      result = optimizer.step();
    }
    device_->skips.add_(found.ne(0));
    state.stage = Stage::kStepped;
    return result;
  }
  if (amp != nullptr) {  // Python hands a fused optimizer the flag too: it changes nothing then
    AmpStepArgs args;
    // A clip coefficient (clip_grad_norm_) divides the scale: g / (s / c) = (g / s) * c.
    args.grad_scale =
        state.deferred ? std::optional<float>(schedule_.scale() / state.clip_coef) : std::nullopt;
    args.found_inf = state.found_inf;
    amp->amp_step(args);
    if (!state.found_inf) {
      result = at::Tensor();
    }
  } else if (!state.found_inf) {
    result = optimizer.step();
  }
  if (state.found_inf) {
    ++consecutive_skips_;
  }
  state.stage = Stage::kStepped;
  return result;
}

namespace {

// PyTorch's clip_grad_norm_ coefficient, in float32 as its tensors:
// max_norm / (total_norm + 1e-6), at most 1.
float clip_coefficient(double max_norm, float total_norm) {
  return std::min(1.0f, static_cast<float>(max_norm) / (total_norm + 1e-6f));
}

// Clipping where the gradients are real: one more pass, a multiply by the
// coefficient (none when it is 1 or a gradient is not finite, as the step is
// then skipped). Returns the total norm.
double clip_real_gradients(torch::optim::Optimizer& optimizer, double max_norm, bool found_inf) {
  const std::vector<detail::GradRef> grads = detail::checked_grads(optimizer, true);
  const auto norm = static_cast<float>(std::sqrt(detail::sum_squares(grads)));
  const float coef = clip_coefficient(max_norm, norm);
  if (!found_inf && std::isfinite(norm) && coef < 1.0f) {
    at::NoGradGuard no_grad;
    for (const detail::GradRef& ref : grads) {
      at::Tensor& grad = ref.param.mutable_grad();
      (grad.is_sparse() ? grad._values() : grad).mul_(static_cast<double>(coef));
    }
  }
  return norm;
}

// Whether a gradient of the optimizer lives off the CPU.
bool grads_off_cpu(const torch::optim::Optimizer& optimizer) {
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& p : group.params()) {
      if (p.grad().defined() && !p.grad().device().is_cpu()) {
        return true;
      }
    }
  }
  return false;
}

// Python's clip_grad_norm_ in tensor ops, for gradients off the CPU (or
// with device_state) with no scaler: as its foreach path, per device and
// dtype the gradients' norms (_foreach_norm: one kernel on CUDA), the norm
// of those norms, then every gradient times the clamped coefficient (also 1,
// and also where the norm is not finite, as Python; _foreach_mul_), with no
// read back. The groups go in order of first appearance; Python's in its
// hash map's, so with more than one group the norm's last bit may differ.
// The norm has the gradients' dtype (Python's); none: a float32 0.
at::Tensor clip_real_gradients_on_device(torch::optim::Optimizer& optimizer, double max_norm) {
  const std::vector<detail::GradRef> refs = detail::checked_grads(optimizer, true);
  std::vector<at::Tensor> values;
  for (const detail::GradRef& ref : refs) {
    at::Tensor& grad = ref.param.mutable_grad();
    if (grad.is_sparse()) {  // repeated indices counted once, as the host path
      grad = grad.coalesce();
    }
    values.push_back(grad.is_sparse() ? grad._values() : grad);
  }
  const std::vector<std::vector<at::Tensor>> groups = detail::by_device_and_dtype(values);
  if (groups.empty()) {  // nothing to clip (Python: a 0 norm)
    return at::zeros({}, at::kFloat);
  }
  const c10::Device first = groups.front().front().device();
  std::vector<at::Tensor> norms;
  for (const std::vector<at::Tensor>& g : groups) {
    for (const at::Tensor& n : at::_foreach_norm(g, 2)) {
      norms.push_back(n.device() == first ? n : n.to(first));
    }
  }
  const at::Tensor norm = at::linalg_vector_norm(at::stack(norms), 2);
  const at::Tensor coef = norm.add(1e-6).reciprocal().mul(max_norm).clamp_max(1.0);
  at::NoGradGuard no_grad;
  for (const std::vector<at::Tensor>& g : groups) {
    compat::foreach_mul_(g, coef.to(g.front().device()));
  }
  return norm;
}

}  // namespace

void GradScaler::check_capturable_(const char* call, bool host_optimizer) const {
  if (!device_ || !compat::capturing(device_->scale.device())) {
    return;
  }
  const char* what = max_consecutive_skips_ > 0 ? "max_consecutive_skips > 0"
                     : found_inf_reducer_       ? "a found-inf reducer (set_found_inf_reducer)"
                     : host_optimizer ? "an optimizer that does not take the flag as a tensor "
                                        "(no StepSupportsAmpScaling, prepare_amp_step() false, or "
                                        "takes_device_args() false)"
                                      : nullptr;
  TORCH_CHECK(what == nullptr, "GradScaler::", call,
              " while a CUDA graph is being captured: ", what,
              " reads the found-inf flag back to the host at every step, which a captured step "
              "cannot do (docs/grad_scaler.md#a-step-in-a-cuda-graph)");
}

double GradScaler::clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm) {
  at::Tensor on_device;
  const double norm = clip_(optimizer, max_norm, &on_device, /*tensor_form=*/false);
  return on_device.defined() ? static_cast<double>(on_device.item<float>()) : norm;  // one read
}

at::Tensor GradScaler::clip_grad_norm_tensor_(torch::optim::Optimizer& optimizer, double max_norm) {
  at::Tensor on_device;
  const double norm = clip_(optimizer, max_norm, &on_device, /*tensor_form=*/true);
  return on_device.defined() ? on_device : at::scalar_tensor(norm, at::kFloat);
}

double GradScaler::clip_(torch::optim::Optimizer& optimizer, double max_norm, at::Tensor* on_device,
                         bool tensor_form) {
  TORCH_CHECK_VALUE(std::isfinite(max_norm) && max_norm >= 0,
                    "GradScaler::clip_grad_norm_: max_norm must be finite and >= 0, got ",
                    max_norm);
  if (!is_enabled()) {
    // No read back: gradients off the CPU, or on it with device_state (the
    // path CUDA takes, as the enabled scaler's).
    if (tensor_form && (device_state_ || grads_off_cpu(optimizer))) {
      *on_device = clip_real_gradients_on_device(optimizer, max_norm);
      return std::numeric_limits<double>::quiet_NaN();
    }
    return clip_real_gradients(optimizer, max_norm, false);
  }
  check_ready_for_unscale_(optimizer);
  auto* amp = dynamic_cast<StepSupportsAmpScaling*>(&optimizer);
  if (amp == nullptr || !amp->prepare_amp_step()) {
    unscale_(optimizer);
    if (device_) {  // the flag on the device: Python's clip in tensor ops, no read back
      *on_device = clip_real_gradients_on_device(optimizer, max_norm);
      return std::numeric_limits<double>::quiet_NaN();
    }
    return clip_real_gradients(optimizer, max_norm, per_optimizer_[&optimizer].found_inf);
  }
  OptimizerState state;
  state.deferred = true;
  if (device_ || device_state_ || grads_off_cpu(optimizer)) {
    at::Tensor norm;
    TORCH_CHECK(unscale_on_device_(optimizer, state, /*unscale=*/false, &norm),
                "No inf checks were recorded for this optimizer.");
    // As clip_coefficient below, in float32 tensors; 1 on overflow.
    const at::Tensor coef =
        at::full_like(norm, static_cast<float>(max_norm)).div(norm.add(1e-6f)).clamp_max(1.0f);
    const at::Tensor keep = found_total_(state).ne(0).logical_or(at::isfinite(norm).logical_not());
    state.clip_coef_on = at::where(keep, at::ones_like(coef), coef);
    state.stage = Stage::kUnscaled;
    per_optimizer_[&optimizer] = std::move(state);
    *on_device = norm;
    return std::numeric_limits<double>::quiet_NaN();
  }
  double sum_squares = 0;
  TORCH_CHECK(unscale_grads_(optimizer, state, /*unscale=*/false, &sum_squares),
              "No inf checks were recorded for this optimizer.");
  // The real gradients' norm: the scaled gradients' divided by the scale.
  const auto norm =
      static_cast<float>(std::sqrt(sum_squares) / static_cast<double>(schedule_.scale()));
  state.clip_coef =
      state.found_inf || !std::isfinite(norm) ? 1.0f : clip_coefficient(max_norm, norm);
  state.stage = Stage::kUnscaled;
  per_optimizer_[&optimizer] = std::move(state);
  return norm;
}

StepResult GradScaler::step(torch::optim::Optimizer& optimizer, LossClosure closure) {
  if (!is_enabled()) {
    return optimizer.step(std::move(closure));
  }
  TORCH_CHECK(false,
              "Closure use is not currently supported if GradScaler is enabled: a closure re-runs "
              "backward() and its gradients would never be unscaled. Call scale(loss).backward() "
              "yourself, then step(optimizer).");
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!is_enabled()) {
    return;
  }
  if (new_scale) {
    host_();
    schedule_.set_scale(*new_scale);  // validates first
    write_device_();
  } else {
    bool checked = false;
    for (const auto& kv : per_optimizer_) {
      checked = checked || kv.second.checked;
    }
    TORCH_CHECK(checked, "No inf checks were recorded prior to update.");
    if (device_) {
      update_on_device_();
    } else {
      bool found = false;
      for (const auto& kv : per_optimizer_) {
        found = found || (kv.second.checked && kv.second.found_inf);
      }
      schedule_.update(found);
      if (!found) {
        consecutive_skips_ = 0;
      }
    }
  }
  per_optimizer_.clear();
}

// ScaleSchedule::update on the device, with no host read: ATen's
// _amp_update_scale_ where PyTorch's rule is the schedule's (backoff after
// one overflow, no floor, the tracker below its interval), else the same
// arithmetic as ScaleSchedule::advance in tensor ops (Paddle's rule,
// min_scale).
void GradScaler::update_on_device_() {
  OnDevice& d = *device_;
  // Python: every optimizer's flags on the scale's device, summed.
  at::Tensor found;
  for (const auto& kv : per_optimizer_) {
    if (kv.second.checked) {
      const at::Tensor f = found_total_(kv.second);
      found = found.defined() ? found.add(f) : f;
    }
  }
  const ScaleSchedule& s = schedule_;  // its factors and intervals: host values
  if (s.dynamic() && s.backoff_interval() == 1 && s.min_scale() == 0 && d.tracker_below_interval) {
    at::_amp_update_scale_(d.scale, d.growth, found, s.growth_factor(), s.backoff_factor(),
                           s.growth_interval());
  } else if (s.dynamic()) {
    const at::Tensor overflow = found.ne(0);
    const at::Tensor clean = overflow.logical_not();
    // An overflowing update: the clean count resets, the overflow count
    // grows, and at its interval the scale backs off (not below the floor,
    // a scale already below it stays).
    const at::Tensor b1 = at::where(overflow, d.backoff.add(1), at::zeros_like(d.backoff));
    const at::Tensor back = overflow.logical_and(b1.ge(s.backoff_interval()));
    const at::Tensor backed = d.scale.to(at::kDouble).mul(s.backoff_factor()).to(at::kFloat);
    const at::Tensor floored =
        at::where(backed.to(at::kDouble).ge(s.min_scale()), backed,
                  at::minimum(d.scale, at::full_like(d.scale, static_cast<float>(s.min_scale()))));
    // A clean one: the reverse, and at its interval the scale grows unless
    // that leaves float32's range.
    const at::Tensor g1 = at::where(clean, d.growth.add(1), at::zeros_like(d.growth));
    const at::Tensor grow = clean.logical_and(g1.ge(s.growth_interval()));
    const at::Tensor grown = d.scale.to(at::kDouble).mul(s.growth_factor()).to(at::kFloat);
    const at::Tensor next =
        at::where(back, floored, at::where(grow.logical_and(at::isfinite(grown)), grown, d.scale));
    d.growth.copy_(at::where(grow, at::zeros_like(g1), g1));
    d.backoff.copy_(at::where(back, at::zeros_like(b1), b1));
    d.scale.copy_(next);
    d.tracker_below_interval = true;
  }
  d.skips.mul_(found.ne(0));  // a clean update ends a run of skips
}

double GradScaler::get_scale() const {
  return is_enabled() ? static_cast<double>(host_().scale()) : 1.0;
}

void GradScaler::set_growth_factor(double growth_factor) {
  schedule_.set_growth_factor(growth_factor);
}

void GradScaler::set_backoff_factor(double backoff_factor) {
  schedule_.set_backoff_factor(backoff_factor);
}

void GradScaler::set_growth_interval(int64_t growth_interval) {
  host_();
  schedule_.set_growth_interval(growth_interval);
  if (device_) {
    device_->tracker_below_interval =
        schedule_.growth_tracker() < growth_interval && schedule_.backoff_tracker() == 0;
  }
}

void GradScaler::set_backoff_interval(int64_t backoff_interval) {
  schedule_.set_backoff_interval(backoff_interval);
}

void GradScaler::set_min_scale(double min_scale) {
  schedule_.set_min_scale(min_scale);
}

void GradScaler::set_max_consecutive_skips(int64_t max_consecutive_skips) {
  ScaleSchedule::check_tracker(max_consecutive_skips, "max_consecutive_skips");
  max_consecutive_skips_ = max_consecutive_skips;
}

void GradScaler::set_init_scale(double init_scale) {
  ScaleSchedule::check_scale(init_scale, "init_scale");
  host_();
  schedule_.set_scale(init_scale);
  init_scale_ = init_scale;
  write_device_();
}

}  // namespace torchamp
