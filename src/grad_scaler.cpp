#include <torchamp/grad_scaler.h>

#include "kernels/kernels.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <utility>

namespace torchamp {
namespace {

std::string param_name(size_t group, size_t index) {
  return "param_groups[" + std::to_string(group) + "].params[" + std::to_string(index) + "]";
}

// Every gradient of the optimizer, validated: throws (and changes nothing) on
// the first one the scaler cannot unscale.
struct GradRef {
  at::Tensor param;
};

std::vector<GradRef> checked_grads(torch::optim::Optimizer& optimizer) {
  std::vector<GradRef> grads;
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& grad = params[i].grad();
      if (!grad.defined()) {
        continue;
      }
      const auto dtype = grad.scalar_type();
      TORCH_CHECK_VALUE(dtype != at::kHalf,
                        "Attempting to unscale FP16 gradients: ", param_name(g, i),
                        " has a Half gradient. Keep parameters (and so their gradients) in float32 "
                        "and let torchamp::autocast run the forward pass in half precision.");
      TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(dtype),
                                  "GradScaler cannot unscale complex "
                                  "gradients: ",
                                  param_name(g, i), " has a ", dtype, " gradient.");
      TORCH_CHECK_NOT_IMPLEMENTED(
          dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16,
          "GradScaler can unscale Float, Double and BFloat16 gradients only: ", param_name(g, i),
          " has a ", dtype, " gradient.");
      TORCH_CHECK_NOT_IMPLEMENTED(grad.layout() == at::kStrided || grad.layout() == at::kSparse,
                                  "GradScaler can unscale strided and sparse COO gradients only: ",
                                  param_name(g, i), " has a ", grad.layout(), " gradient.");
      grads.push_back({params[i]});
    }
  }
  return grads;
}

// found_inf as ATen's AMP ops keep it: a 1-element float32 tensor, 0 or 1.
at::Tensor zero_flag(c10::Device device) {
  return at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options),
      schedule_(options.init_scale(), options.growth_factor(), options.backoff_factor(),
                options.growth_interval(), options.backoff_interval(), options.dynamic()) {}

at::Tensor GradScaler::scale(const at::Tensor& output) {
  TORCH_CHECK_VALUE(output.defined(), "GradScaler::scale: the output tensor is undefined");
  if (!is_enabled()) {
    return output;
  }
  // A scalar keeps the output's dtype and device: no host-device copy, and the
  // scaled loss has the loss's shape (Python's 1-element tensor broadcasts).
  return output.mul(static_cast<double>(schedule_.scale()));
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

// Gradients grouped the way the kernels take them.
struct Buckets {
  std::vector<at::Tensor> cpu;
  // CUDA buckets keyed by (device index, dtype); any other device as is.
  std::map<std::pair<c10::DeviceIndex, at::ScalarType>, std::vector<at::Tensor>> cuda;
  std::vector<at::Tensor> other;
};

// Sparse gradients are coalesced (in the parameter) and their values taken.
Buckets bucket_grads(const std::vector<GradRef>& grads) {
  Buckets b;
  for (const GradRef& ref : grads) {
    at::Tensor grad = ref.param.grad();
    if (grad.is_sparse()) {
      ref.param.mutable_grad() = grad.coalesce();
      grad = ref.param.grad()._values();
    }
    if (grad.device().is_cpu()) {
      b.cpu.push_back(grad);
    } else if (grad.device().is_cuda()) {
      b.cuda[{grad.device().index(), grad.scalar_type()}].push_back(grad);
    } else {
      b.other.push_back(grad);
    }
  }
  return b;
}

// Multiplies every gradient by inv_scale (1: a check only, nothing written on
// the CPU) and returns whether a CPU gradient held an inf/NaN; flags for the
// other devices are appended to device_found (read on the host later).
bool unscale_buckets(Buckets& b, float inv_scale, std::vector<at::Tensor>& device_found) {
  const bool found = kernels::unscale_cpu_(b.cpu, inv_scale);
  auto flag_for = [&device_found](c10::Device device) -> at::Tensor& {
    for (at::Tensor& flag : device_found) {
      if (flag.device() == device) {
        return flag;
      }
    }
    device_found.push_back(zero_flag(device));
    return device_found.back();
  };
  // CUDA: ATen's fused kernel per (device, dtype) bucket.
  for (auto& [key, bucket] : b.cuda) {
    const c10::Device device(c10::DeviceType::CUDA, key.first);
    const at::Tensor inv =
        at::full({1}, inv_scale, at::TensorOptions().dtype(at::kFloat).device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(bucket, flag_for(device), inv);
  }
  // Any other device: plain ATen ops, same arithmetic (bfloat16 in float32).
  for (at::Tensor& grad : b.other) {
    flag_for(grad.device()).logical_or_(at::isfinite(grad).logical_not().any());
    if (inv_scale == 1.0f) {
      continue;
    }
    if (grad.scalar_type() == at::kBFloat16) {
      grad.copy_(grad.to(at::kFloat).mul_(static_cast<double>(inv_scale)));
    } else {
      grad.mul_(static_cast<double>(inv_scale));
    }
  }
  return found;
}

}  // namespace

bool GradScaler::unscale_grads_(torch::optim::Optimizer& optimizer, OptimizerState& state) {
  const std::vector<GradRef> grads = checked_grads(optimizer);  // throws before any change
  at::NoGradGuard no_grad;
  Buckets buckets = bucket_grads(grads);

  // With a reducer, ranks agree first (a read-only pass, then one collective),
  // so a failed collective leaves every gradient and stage as it was.
  std::optional<bool> agreed;
  if (found_inf_reducer_) {
    std::vector<at::Tensor> flags;
    bool local = unscale_buckets(buckets, 1.0f, flags);
    for (const at::Tensor& flag : flags) {
      local = local || flag.item<float>() != 0.0f;
    }
    agreed = found_inf_reducer_(
        local, grads.empty() ? c10::Device(c10::kCPU) : grads.front().param.grad().device());
  }
  if (grads.empty()) {
    return false;
  }
  // PyTorch: inv_scale = scale.double().reciprocal().float()
  const auto inv_scale = static_cast<float>(1.0 / static_cast<double>(schedule_.scale()));
  std::vector<at::Tensor> device_found;
  const bool found = unscale_buckets(buckets, inv_scale, device_found);

  state.checked = true;
  if (agreed) {
    state.found_inf = *agreed;
  } else {
    state.found_inf = found;
    state.device_found = std::move(device_found);
  }
  return true;
}

bool GradScaler::resolve_found_inf(OptimizerState& state) {
  for (const at::Tensor& flag : state.device_found) {
    state.found_inf = state.found_inf || flag.item<float>() != 0.0f;
  }
  state.device_found.clear();
  return state.found_inf;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    return;
  }
  auto it = per_optimizer_.find(&optimizer);
  if (it != per_optimizer_.end()) {
    TORCH_CHECK(it->second.stage != Stage::kUnscaled,
                "unscale_() has already been called on this optimizer since the last update().");
    TORCH_CHECK(it->second.stage != Stage::kStepped, "unscale_() is being called after step().");
  }
  OptimizerState state;
  unscale_grads_(optimizer, state);  // no state is stored if this throws
  state.stage = Stage::kUnscaled;
  per_optimizer_[&optimizer] = std::move(state);
}

std::optional<at::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    return optimizer.step();
  }
  auto it = per_optimizer_.find(&optimizer);
  if (it == per_optimizer_.end()) {  // ready: unscale here
    OptimizerState state;
    TORCH_CHECK(unscale_grads_(optimizer, state),
                "No inf checks were recorded for this optimizer.");
    state.stage = Stage::kUnscaled;
    it = per_optimizer_.emplace(&optimizer, std::move(state)).first;
  }
  OptimizerState& state = it->second;
  TORCH_CHECK(state.stage != Stage::kStepped,
              "step() has already been called since the last update().");
  TORCH_CHECK(state.checked, "No inf checks were recorded for this optimizer.");
  std::optional<at::Tensor> result;
  if (!resolve_found_inf(state)) {
    result = optimizer.step();
  }
  state.stage = Stage::kStepped;
  return result;
}

std::optional<at::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer,
                                           LossClosure closure) {
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
    schedule_.set_scale(*new_scale);  // validates first
  } else {
    bool checked = false;
    for (const auto& kv : per_optimizer_) {
      checked = checked || kv.second.checked;
    }
    TORCH_CHECK(checked, "No inf checks were recorded prior to update.");
    bool found = false;
    for (auto& kv : per_optimizer_) {
      if (kv.second.checked) {
        found = resolve_found_inf(kv.second) || found;
      }
    }
    schedule_.update(found);
  }
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  return is_enabled() ? static_cast<double>(schedule_.scale()) : 1.0;
}

void GradScaler::set_growth_factor(double growth_factor) {
  schedule_.set_growth_factor(growth_factor);
  options_.growth_factor(growth_factor);
}

void GradScaler::set_backoff_factor(double backoff_factor) {
  schedule_.set_backoff_factor(backoff_factor);
  options_.backoff_factor(backoff_factor);
}

void GradScaler::set_growth_interval(int64_t growth_interval) {
  schedule_.set_growth_interval(growth_interval);
  options_.growth_interval(growth_interval);
}

void GradScaler::set_backoff_interval(int64_t backoff_interval) {
  schedule_.set_backoff_interval(backoff_interval);
  options_.backoff_interval(backoff_interval);
}

}  // namespace torchamp
