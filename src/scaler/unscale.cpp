// The general unscale path: validation with typed errors, then per device
// (see unscale.h).

#include "scaler/unscale.h"

#include "compat/compat.h"
#include "kernels/kernels.h"

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/stack.h>
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

// The tensor a gradient is unscaled in: itself, or a sparse one's values
// (coalesced first, in the parameter).
at::Tensor values_of(const GradRef& ref) {
  const at::Tensor& grad = ref.param.grad();
  if (!grad.is_sparse()) {
    return grad;
  }
  ref.param.mutable_grad() = grad.coalesce();
  return ref.param.grad()._values();
}

}  // namespace

Buckets bucket_grads(const std::vector<GradRef>& grads) {
  Buckets b;
  for (size_t r = 0; r < grads.size(); ++r) {
    at::Tensor grad = values_of(grads[r]);
    TORCH_INTERNAL_ASSERT(grad.device().is_cpu(), "the host path took a gradient on ",
                          grad.device(), " (unscale_on_devices takes those)");
    b.cpu.push_back(std::move(grad));
    b.cpu_ref.push_back(r);
  }
  return b;
}

// Multiplies every gradient by inv_scale (none: a check only, nothing
// written) and returns, per GradRef, whether it held an inf/NaN: the flags of
// torchamp's fused CPU pass.
std::vector<uint8_t> unscale_buckets(Buckets& b, size_t n, std::optional<float> inv_scale) {
  std::vector<uint8_t> found(n, 0);
  std::vector<uint8_t> cpu_found;
  if (kernels::unscale_cpu_(b.cpu, inv_scale.value_or(1.0f), &cpu_found)) {
    for (size_t i = 0; i < cpu_found.size(); ++i) {
      found[b.cpu_ref[i]] = cpu_found[i];
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
  std::vector<at::Tensor> values;
  values.reserve(grads.size());
  for (const GradRef& ref : grads) {
    values.push_back(values_of(ref));
  }
  for (const std::vector<at::Tensor>& g : by_device_and_dtype(values)) {
    const c10::Device device = g.front().device();
    at::Tensor& flag = flag_for(device);
    const at::Tensor inv = inv_scale.defined()
                               ? inv_scale.to(device)
                               : at::ones({}, at::TensorOptions().dtype(at::kFloat).device(device));
    // ATen's CUDA kernel takes float32/float64/float16 only.
    if (device.is_cpu() || (device.is_cuda() && g.front().scalar_type() != at::kBFloat16)) {
      at::_amp_foreach_non_finite_check_and_unscale_(g, flag, inv);
      continue;
    }
    for (const at::Tensor& grad : g) {
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

std::vector<std::vector<at::Tensor>> by_device_and_dtype(const std::vector<at::Tensor>& tensors) {
  std::vector<std::vector<at::Tensor>> groups;
  for (const at::Tensor& t : tensors) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<at::Tensor>& g) {
      return g.front().device() == t.device() && g.front().scalar_type() == t.scalar_type();
    });
    if (it == groups.end()) {
      groups.emplace_back();
      it = groups.end() - 1;
    }
    it->push_back(t);
  }
  return groups;
}

at::Tensor sum_squares_on(const std::vector<GradRef>& grads, c10::Device device) {
  at::Tensor total = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  // Dense gradients by device and dtype: their float64 norms in one
  // multi-tensor op (a few kernels for the lot, not four a gradient),
  // squared and summed; a sparse one's values on their own.
  std::vector<at::Tensor> dense;
  for (const GradRef& ref : grads) {
    const at::Tensor& grad = ref.param.grad();
    if (grad.is_sparse()) {
      total.add_(grad.coalesce()._values().to(at::kDouble).square().sum().to(device));
    } else {
      dense.push_back(grad);
    }
  }
  for (const std::vector<at::Tensor>& g : by_device_and_dtype(dense)) {
    total.add_(at::stack(compat::norms_in_float64(g)).square().sum().to(device));
  }
  return total;
}

}  // namespace detail
}  // namespace torchamp
