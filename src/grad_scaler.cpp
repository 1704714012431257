#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include "compat.h"
#include "kernels/kernels.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

namespace torchamp {
namespace detail {

// An optimizer's gradients as the CPU kernels take them, kept between steps:
// what does not change from one step to the next (the parameter list, which
// parameters have gradients, their dtypes, element counts, layouts, devices)
// is validated once; a step only walks the parameters, confirms that each
// gradient still has its recorded shape of things, and refreshes the data
// pointers (gradients are usually new tensors every step: zero_grad() sets
// them to none). No per-tensor validation, reference counting, allocation or
// grouping.
//
// Built only when every gradient is a dense, contiguous CPU tensor of a dtype
// the scaler unscales (float32, float64, bfloat16); anything else (sparse,
// CUDA, non-contiguous, a dtype that must be refused) leaves it invalid and the
// step takes the general path, whose validation throws the errors.
//
// A different number of groups or parameters (a parameter or group added or
// removed), a gradient created or dropped, or one whose dispatch keys (device,
// layout), dtype, element count or contiguity differ from its entry rebuilds
// the cache before anything is unscaled.
struct GradCache {
  struct Entry {
    c10::DispatchKeySet keys;  // of the gradient: device type, layout
    int64_t numel;
    caffe2::TypeMeta dtype;
    bool has_grad;
    int32_t span;  // index into `spans`; -1: no gradient or no elements
    uint32_t group;
    uint32_t index;
  };
  bool valid = false;
  std::vector<size_t> group_sizes;
  std::vector<Entry> entries;     // every parameter, in optimizer order
  std::vector<uint32_t> span_of;  // span -> entry (gradients with elements)
  size_t grads = 0;               // entries with a gradient
  kernels::SpanList spans;        // data pointers refreshed every step
};

struct GradCaches::Map {
  std::unordered_map<const torch::optim::Optimizer*, GradCache> caches;
};

GradCaches::GradCaches() : map_(std::make_unique<Map>()) {}
GradCaches::~GradCaches() = default;
GradCaches::GradCaches(const GradCaches& /*other*/) : map_(std::make_unique<Map>()) {}
GradCaches& GradCaches::operator=(const GradCaches& other) {
  if (this != &other) {
    map_ = std::make_unique<Map>();
  }
  return *this;
}
GradCaches::GradCaches(GradCaches&& other) noexcept = default;
GradCaches& GradCaches::operator=(GradCaches&& other) noexcept = default;

GradCache& GradCaches::of(const torch::optim::Optimizer* optimizer) {
  if (!map_) {  // moved from
    map_ = std::make_unique<Map>();
  }
  return map_->caches[optimizer];
}

}  // namespace detail

namespace {

using detail::GradCache;

bool cacheable(const at::Tensor& grad) {
  const auto dtype = grad.scalar_type();
  return grad.layout() == at::kStrided && grad.device().is_cpu() && grad.is_contiguous() &&
         (dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16);
}

// Whether the optimizer still looks as `cache` recorded; if so the spans'
// data pointers are refreshed. Per parameter it reads only the gradient's
// handle, the fields compared and the storage's data pointer, but each
// parameter is a chain of four objects (parameter, autograd metadata,
// gradient, storage), so with thousands of parameters the walk is split
// across ATen's intra-op threads like the kernels.
bool refresh_cache(GradCache& cache, const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  if (!cache.valid || groups.size() != cache.group_sizes.size()) {
    return false;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].params().size() != cache.group_sizes[g]) {
      return false;
    }
  }
  std::atomic<bool> same{true};
  constexpr int64_t kParamsPerTask = 2048;
  at::parallel_for(0, static_cast<int64_t>(cache.entries.size()), kParamsPerTask,
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       const GradCache::Entry& e = cache.entries[i];
                       const at::Tensor& param = groups[e.group].params()[e.index];
                       // The impl's own accessor: Tensor::grad() also asks
                       // autograd whether the tensor is a leaf, for a warning
                       // that does not apply to parameters.
                       const at::Tensor& grad = param.unsafeGetTensorImpl()->grad();
                       if (!grad.defined()) {
                         if (e.has_grad) {
                           same.store(false, std::memory_order_relaxed);
                           return;
                         }
                         continue;
                       }
                       const c10::TensorImpl* impl = grad.unsafeGetTensorImpl();
                       if (!e.has_grad || impl->key_set() != e.keys || impl->dtype() != e.dtype ||
                           impl->numel() != e.numel || !impl->is_contiguous()) {
                         same.store(false, std::memory_order_relaxed);
                         return;
                       }
                       if (e.span >= 0) {
                         cache.spans.set_data(e.span, compat::dense_data_for_write(*impl));
                       }
                     }
                   });
  return same.load(std::memory_order_relaxed);
}

// A valid cache if every gradient is cacheable, else an invalid one. Throws
// nothing: gradients that must be refused are left to the general path.
GradCache build_cache(const torch::optim::Optimizer& optimizer) {
  GradCache cache;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    if (params.size() + cache.entries.size() >
        static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
      return GradCache();  // beyond the entries' 32-bit indices: the general path
    }
    cache.group_sizes.push_back(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& grad = params[i].unsafeGetTensorImpl()->grad();
      GradCache::Entry e;
      e.keys = c10::DispatchKeySet();
      e.numel = 0;
      e.has_grad = grad.defined();
      e.span = -1;
      e.group = static_cast<uint32_t>(g);
      e.index = static_cast<uint32_t>(i);
      if (e.has_grad) {
        if (!cacheable(grad)) {
          return GradCache();
        }
        e.keys = grad.unsafeGetTensorImpl()->key_set();
        e.dtype = grad.dtype();
        e.numel = grad.numel();
        ++cache.grads;
        if (e.numel > 0) {
          e.span = static_cast<int32_t>(cache.spans.size());
          cache.spans.add(grad.data_ptr(), e.numel, grad.scalar_type());
          cache.span_of.push_back(static_cast<uint32_t>(cache.entries.size()));
        }
      }
      cache.entries.push_back(e);
    }
  }
  cache.valid = true;
  return cache;
}

std::string param_name(size_t group, size_t index) {
  return "param_groups[" + std::to_string(group) + "].params[" + std::to_string(index) + "]";
}

// Every gradient of the optimizer, validated: throws (and changes nothing) on
// the first one the scaler cannot unscale.
struct GradRef {
  at::Tensor param;
  size_t group;
  size_t index;
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
      grads.push_back({params[i], g, i});
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
                options.growth_interval(), options.backoff_interval(), options.dynamic(),
                options.min_scale()) {
  ScaleSchedule::check_tracker(options.max_consecutive_skips(), "max_consecutive_skips");
}

at::Tensor GradScaler::scale(const at::Tensor& output) {
  TORCH_CHECK_VALUE(output.defined(), "GradScaler::scale: the output tensor is undefined");
  if (!is_enabled()) {
    return output;
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

// Gradients grouped the way the kernels take them; *_ref map each tensor
// back to its position in the GradRef list.
struct Buckets {
  std::vector<at::Tensor> cpu;
  std::vector<size_t> cpu_ref;
  // CUDA buckets keyed by (device index, dtype); any other device as is.
  std::map<std::pair<c10::DeviceIndex, at::ScalarType>, std::vector<at::Tensor>> cuda;
  std::vector<at::Tensor> other;                          // other devices, and bfloat16 on CUDA
  std::vector<std::pair<at::Tensor, size_t>> device_ref;  // every non-CPU tensor
};

// Sparse gradients are coalesced (in the parameter) and their values taken.
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

// Multiplies every gradient by inv_scale (1: a check only, nothing written on
// the CPU) and returns, per GradRef, whether it held an inf/NaN. CPU flags
// come from the fused pass; other devices are read back once per device (one
// host sync), and only a device that reports an overflow is checked tensor by
// tensor.
std::vector<uint8_t> unscale_buckets(Buckets& b, size_t n, float inv_scale) {
  std::vector<uint8_t> found(n, 0);
  std::vector<uint8_t> cpu_found;
  if (kernels::unscale_cpu_(b.cpu, inv_scale, &cpu_found)) {
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
    const at::Tensor inv =
        at::full({1}, inv_scale, at::TensorOptions().dtype(at::kFloat).device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(bucket, flag_for(device), inv);
  }
  // Any other device (and CUDA bfloat16): plain ATen ops per tensor, the same
  // arithmetic (bfloat16 in float32, rounded once).
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

bool any_of(const std::vector<uint8_t>& flags) {
  for (uint8_t f : flags) {
    if (f != 0) {
      return true;
    }
  }
  return false;
}

}  // namespace

bool GradScaler::unscale_cached_(torch::optim::Optimizer& optimizer, GradCache& cache,
                                 OptimizerState& state, bool unscale) {
  const auto inv_scale = static_cast<float>(1.0 / static_cast<double>(schedule_.scale()));
  const bool write = unscale && inv_scale != 1.0f;
  std::optional<bool> agreed;
  bool any = false;
  if (found_inf_reducer_) {
    any = cache.spans.run(/*write=*/false, 1.0f);
    agreed = found_inf_reducer_(any, c10::Device(c10::kCPU));
  }
  if (cache.grads == 0) {
    return false;
  }
  if (write || !agreed) {  // a check pass already gave the flags when nothing is written
    any = cache.spans.run(write, inv_scale);
  }
  std::vector<NonFiniteGradient> report;
  if (any) {
    for (size_t s = 0; s < cache.spans.size(); ++s) {
      if (cache.spans.found(s)) {
        const GradCache::Entry& e = cache.entries[cache.span_of[s]];
        const at::Tensor& param = optimizer.param_groups()[e.group].params()[e.index];
        auto name = parameter_names_.find(param.unsafeGetTensorImpl());
        report.push_back(
            {e.group, e.index, name == parameter_names_.end() ? std::string() : name->second});
      }
    }
  }
  state.checked = true;
  state.found_inf = agreed ? *agreed : !report.empty();
  last_non_finite_[&optimizer] = std::move(report);
  return true;
}

bool GradScaler::unscale_grads_(torch::optim::Optimizer& optimizer, OptimizerState& state,
                                bool unscale) {
  GradCache& cache = grad_caches_.of(&optimizer);
  if (!refresh_cache(cache, optimizer)) {
    cache = build_cache(optimizer);
  }
  if (cache.valid) {
    return unscale_cached_(optimizer, cache, state, unscale);
  }
  const std::vector<GradRef> grads = checked_grads(optimizer);  // throws before any change
  at::NoGradGuard no_grad;
  Buckets buckets = bucket_grads(grads);

  // With a reducer, ranks agree first (a read-only pass, then one collective),
  // so a failed collective leaves every gradient and stage as it was.
  std::optional<bool> agreed;
  if (found_inf_reducer_) {
    const bool local = any_of(unscale_buckets(buckets, grads.size(), 1.0f));
    agreed = found_inf_reducer_(
        local, grads.empty() ? c10::Device(c10::kCPU) : grads.front().param.grad().device());
  }
  if (grads.empty()) {
    return false;
  }
  // PyTorch: inv_scale = scale.double().reciprocal().float()
  const auto inv_scale = static_cast<float>(1.0 / static_cast<double>(schedule_.scale()));
  const std::vector<uint8_t> found =
      unscale_buckets(buckets, grads.size(), unscale ? inv_scale : 1.0f);

  std::vector<NonFiniteGradient> report;
  for (size_t r = 0; r < grads.size(); ++r) {
    if (found[r] != 0) {
      auto name = parameter_names_.find(grads[r].param.unsafeGetTensorImpl());
      report.push_back({grads[r].group, grads[r].index,
                        name == parameter_names_.end() ? std::string() : name->second});
    }
  }
  state.checked = true;
  state.found_inf = agreed ? *agreed : !report.empty();
  last_non_finite_[&optimizer] = std::move(report);
  return true;
}

std::vector<NonFiniteGradient> GradScaler::non_finite_gradients(
    const torch::optim::Optimizer& optimizer) const {
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
    out += (i ? ", " : "") + param_name(list[i].group, list[i].index);
    if (!list[i].name.empty()) {
      out += " '" + list[i].name + "'";
    }
  }
  if (list.size() > 10) {
    out += " and " + std::to_string(list.size() - 10) + " more";
  }
  return out;
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
  unscale_grads_(optimizer, state, /*unscale=*/true);  // no state is stored if this throws
  state.stage = Stage::kUnscaled;
  per_optimizer_[&optimizer] = std::move(state);
}

std::optional<at::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    return optimizer.step();
  }
  auto it = per_optimizer_.find(&optimizer);
  if (it == per_optimizer_.end()) {  // ready: unscale here, or check for a fused update
    auto* fused = dynamic_cast<optim::FusedStep*>(&optimizer);
    OptimizerState state;
    state.deferred = fused != nullptr && fused->can_fuse();
    TORCH_CHECK(unscale_grads_(optimizer, state, /*unscale=*/!state.deferred),
                "No inf checks were recorded for this optimizer.");
    state.stage = Stage::kUnscaled;
    it = per_optimizer_.emplace(&optimizer, std::move(state)).first;
  }
  OptimizerState& state = it->second;
  TORCH_CHECK(state.stage != Stage::kStepped,
              "step() has already been called since the last update().");
  TORCH_CHECK(state.checked, "No inf checks were recorded for this optimizer.");
  const int64_t max_skips = options_.max_consecutive_skips();
  TORCH_CHECK(!state.found_inf || max_skips == 0 || consecutive_skips_ + 1 < max_skips,
              "GradScaler: ", consecutive_skips_ + 1,
              " steps in a row were skipped because gradients held inf/NaN "
              "(max_consecutive_skips = ",
              max_skips, "); training is not progressing. Current scale: ", schedule_.scale(),
              " (min_scale ", schedule_.min_scale(),
              "). Non-finite gradients in this step: ", describe_non_finite(optimizer),
              ". Look for a NaN in the data or the loss, a learning rate that diverged, or a "
              "float16 overflow in the forward pass.");
  std::optional<at::Tensor> result;
  if (state.found_inf) {
    ++consecutive_skips_;
  } else if (state.deferred) {
    dynamic_cast<optim::FusedStep&>(optimizer).fused_step(
        static_cast<float>(1.0 / static_cast<double>(schedule_.scale())));
    result = at::Tensor();
  } else {
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
    for (const auto& kv : per_optimizer_) {
      found = found || (kv.second.checked && kv.second.found_inf);
    }
    schedule_.update(found);
    if (!found) {
      consecutive_skips_ = 0;
    }
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

void GradScaler::set_min_scale(double min_scale) {
  schedule_.set_min_scale(min_scale);
  options_.min_scale(min_scale);
}

void GradScaler::set_max_consecutive_skips(int64_t max_consecutive_skips) {
  ScaleSchedule::check_tracker(max_consecutive_skips, "max_consecutive_skips");
  options_.max_consecutive_skips(max_consecutive_skips);
}

}  // namespace torchamp
