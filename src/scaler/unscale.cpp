// The general unscale path: validation with typed errors, then per device
// (see unscale.h).

#include "scaler/unscale.h"

#include "kernels/kernels.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <algorithm>

namespace torchamp {
namespace detail {

std::string param_name(size_t group, size_t index) {
  return "param_groups[" + std::to_string(group) + "].params[" + std::to_string(index) + "]";
}

std::vector<GradRef> checked_grads(torch::optim::Optimizer& optimizer, bool allow_fp16) {
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
      TORCH_CHECK_VALUE(dtype != at::kHalf || allow_fp16,
                        "Attempting to unscale FP16 gradients: ", param_name(g, i),
                        " has a Half gradient. Keep parameters (and so their gradients) in float32 "
                        "and let torchamp::autocast run the forward pass in half precision.");
      TORCH_CHECK_NOT_IMPLEMENTED(!at::isComplexType(dtype),
                                  "GradScaler cannot unscale complex "
                                  "gradients: ",
                                  param_name(g, i), " has a ", dtype, " gradient.");
      TORCH_CHECK_NOT_IMPLEMENTED(
          dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
              dtype == at::kHalf,
          "GradScaler can unscale Float, Double and BFloat16 gradients only: ", param_name(g, i),
          " has a ", dtype, " gradient.");
      TORCH_CHECK_NOT_IMPLEMENTED(grad.layout() == at::kStrided || grad.layout() == at::kSparse,
                                  "GradScaler can unscale strided and sparse COO gradients only: ",
                                  param_name(g, i), " has a ", grad.layout(), " gradient.");
      grads.push_back({params[i], g, i});
    }
  }
  return grads;
}

namespace {

// found_inf as ATen's AMP ops keep it: a 1-element float32 tensor, 0 or 1.
at::Tensor zero_flag(c10::Device device) {
  return at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
}

}  // namespace

Buckets bucket_grads(const std::vector<GradRef>& grads) {
  Buckets b;
  for (size_t r = 0; r < grads.size(); ++r) {
    const GradRef& ref = grads[r];
    at::Tensor grad = ref.param.grad();
    if (grad.is_sparse()) {
      ref.param.mutable_grad() = grad.coalesce();
      grad = ref.param.grad()._values();
    }
    if (grad.device().is_cpu()) {
      b.cpu.push_back(grad);
      b.cpu_ref.push_back(r);
      continue;
    }
    // ATen's CUDA kernel takes float32/float64 (and float16) only: bfloat16
    // gradients on CUDA take the per-tensor path below.
    if (grad.device().is_cuda() && grad.scalar_type() != at::kBFloat16) {
      b.cuda[{grad.device().index(), grad.scalar_type()}].push_back(grad);
    } else {
      b.other.push_back(grad);
    }
    b.device_ref.emplace_back(grad, r);
  }
  return b;
}

// Multiplies every gradient by inv_scale (none: a check only, nothing
// written) and returns, per GradRef, whether it held an inf/NaN. CPU flags
// come from the fused pass; other devices are read back once per device (one
// host sync), and only a device that reports an overflow is checked tensor by
// tensor.
std::vector<uint8_t> unscale_buckets(Buckets& b, size_t n, std::optional<float> inv_scale) {
  std::vector<uint8_t> found(n, 0);
  std::vector<uint8_t> cpu_found;
  if (kernels::unscale_cpu_(b.cpu, inv_scale.value_or(1.0f), &cpu_found)) {
    for (size_t i = 0; i < cpu_found.size(); ++i) {
      found[b.cpu_ref[i]] = cpu_found[i];
    }
  }
  if (b.device_ref.empty()) {
    return found;
  }
  std::vector<at::Tensor> device_found;
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
    const at::Tensor inv = at::full({1}, inv_scale.value_or(1.0f),
                                    at::TensorOptions().dtype(at::kFloat).device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(bucket, flag_for(device), inv);
  }
  // Any other device (and CUDA bfloat16): plain ATen ops per tensor, the same
  // arithmetic (bfloat16 in float32, rounded once).
  for (at::Tensor& grad : b.other) {
    flag_for(grad.device()).logical_or_(at::isfinite(grad).logical_not().any());
    if (!inv_scale) {
      continue;
    }
    if (grad.scalar_type() == at::kBFloat16) {
      grad.copy_(grad.to(at::kFloat).mul_(static_cast<double>(*inv_scale)));
    } else {
      grad.mul_(static_cast<double>(*inv_scale));
    }
  }
  for (const at::Tensor& flag : device_found) {
    if (flag.item<float>() == 0.0f) {
      continue;
    }
    // inf/NaN stay inf/NaN through the multiply: find the tensors.
    for (const auto& [grad, r] : b.device_ref) {
      if (grad.device() == flag.device() && !at::isfinite(grad).all().item<bool>()) {
        found[r] = 1;
      }
    }
  }
  return found;
}

double sum_squares(const std::vector<GradRef>& grads) {
  double total = 0;
  for (const GradRef& ref : grads) {
    const at::Tensor& grad = ref.param.grad();
    const at::Tensor values = grad.is_sparse() ? grad.coalesce()._values() : grad;
    total += values.to(at::kDouble).square().sum().item<double>();
  }
  return total;
}

bool any_of(const std::vector<uint8_t>& flags) {
  for (uint8_t f : flags) {
    if (f != 0) {
      return true;
    }
  }
  return false;
}

std::vector<at::Tensor> unscale_on_devices(const std::vector<GradRef>& grads,
                                           const at::Tensor& inv_scale) {
  struct Group {
    c10::Device device;
    at::ScalarType dtype;
    std::vector<at::Tensor> grads;
  };
  std::vector<Group> groups;
  std::vector<at::Tensor> found;
  auto flag_for = [&found](c10::Device device) -> at::Tensor& {
    for (at::Tensor& flag : found) {
      if (flag.device() == device) {
        return flag;
      }
    }
    found.push_back(at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device)));
    return found.back();
  };
  for (const GradRef& ref : grads) {
    at::Tensor grad = ref.param.grad();
    if (grad.is_sparse()) {
      ref.param.mutable_grad() = grad.coalesce();
      grad = ref.param.grad()._values();
    }
    flag_for(grad.device());
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.device == grad.device() && g.dtype == grad.scalar_type();
    });
    if (it == groups.end()) {
      groups.push_back({grad.device(), grad.scalar_type(), {}});
      it = groups.end() - 1;
    }
    it->grads.push_back(grad);
  }
  for (Group& g : groups) {
    at::Tensor& flag = flag_for(g.device);
    const at::Tensor inv =
        inv_scale.defined() ? inv_scale.to(g.device)
                            : at::ones({}, at::TensorOptions().dtype(at::kFloat).device(g.device));
    // ATen's CUDA kernel takes float32/float64/float16 only.
    if (g.device.is_cpu() || (g.device.is_cuda() && g.dtype != at::kBFloat16)) {
      at::_amp_foreach_non_finite_check_and_unscale_(g.grads, flag, inv);
      continue;
    }
    for (at::Tensor& grad : g.grads) {
      flag.logical_or_(at::isfinite(grad).logical_not().any());
      if (!inv_scale.defined()) {
        continue;
      }
      if (grad.scalar_type() == at::kBFloat16) {
        grad.copy_(grad.to(at::kFloat).mul_(inv));
      } else {
        grad.mul_(inv);
      }
    }
  }
  return found;
}

at::Tensor sum_squares_on(const std::vector<GradRef>& grads, c10::Device device) {
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const GradRef& ref : grads) {
    const at::Tensor& grad = ref.param.grad();
    const at::Tensor values = grad.is_sparse() ? grad.coalesce()._values() : grad;
    total.add_(values.to(at::kDouble).square().sum().to(device));
  }
  return total;
}

}  // namespace detail
}  // namespace torchamp
