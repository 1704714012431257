#include "scaler/grad_cache.h"

#include "compat/compat.h"

#include <ATen/Parallel.h>
#include <torch/optim/optimizer.h>

#include <atomic>
#include <limits>
#include <memory>

namespace torchamp {

detail::GradCaches::GradCaches() : map_(std::make_unique<Map>()) {}
detail::GradCaches::~GradCaches() = default;
detail::GradCaches::GradCaches(const GradCaches& /*other*/) : map_(std::make_unique<Map>()) {}
detail::GradCaches& detail::GradCaches::operator=(const GradCaches& other) {
  if (this != &other) {
    map_ = std::make_unique<Map>();
  }
  return *this;
}
detail::GradCaches::GradCaches(GradCaches&& other) noexcept = default;
detail::GradCaches& detail::GradCaches::operator=(GradCaches&& other) noexcept = default;

detail::GradCaches::Map& detail::GradCaches::map() {
  if (!map_) {  // moved from
    map_ = std::make_unique<Map>();
  }
  return *map_;
}

namespace detail {
namespace {

bool cacheable(const at::Tensor& grad) {
  return grad.layout() == at::kStrided && grad.device().is_cpu() && grad.is_contiguous() &&
         kernels::cpu_supports(grad.scalar_type());
}

}  // namespace

// Per parameter it reads only the gradient's
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
  at::parallel_for(
      0, static_cast<int64_t>(cache.entries.size()), kParamsPerTask,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          // The parameters' metadata is cold (the update's
          // streaming pushed it out): fetch a few ahead.
          constexpr int64_t kAhead = 8;
          if (i + kAhead < end) {
            const GradCache::Entry& a = cache.entries[i + kAhead];
            __builtin_prefetch(groups[a.group].params()[a.index].unsafeGetTensorImpl());
          }
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
        cache.has_half = cache.has_half || grad.scalar_type() == at::kHalf;
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

}  // namespace detail
}  // namespace torchamp
