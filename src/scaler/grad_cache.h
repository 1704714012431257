#pragma once

// An optimizer's gradients as the CPU kernels take them, kept between steps
// by the GradScaler (not installed).
//
// What does not change from one step to the next (the parameter list, which
// parameters have gradients, their dtypes, element counts, layouts, devices)
// is validated once; a step only walks the parameters, confirms that each
// gradient still has its recorded shape of things, and refreshes the data
// pointers (gradients are usually new tensors every step: zero_grad() sets
// them to none). No per-tensor validation, reference counting, allocation or
// grouping.
//
// Built only when every gradient is a dense, contiguous CPU tensor of a dtype
// the kernels take (float32, float64, bfloat16, float16); anything else (sparse,
// CUDA, non-contiguous, a dtype that must be refused) leaves it invalid and the
// step takes the general path (unscale.h), whose validation throws the errors.
// float16 gradients are cached (the check before an optimizer that takes the
// scale accepts them); where they must be refused, `has_half` sends the scaler
// to the general path.
//
// A different number of groups or parameters (a parameter or group added or
// removed), a gradient created or dropped, or one whose dispatch keys (device,
// layout), dtype, element count or contiguity differ from its entry rebuilds
// the cache before anything is unscaled.

#include <torchamp/grad_scaler.h>

#include "kernels/kernels.h"

#include <c10/core/DispatchKeySet.h>
#include <c10/util/typeid.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace torchamp {
namespace detail {

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
  bool has_half = false;          // some gradient is float16
  kernels::SpanList spans;        // data pointers refreshed every step
};

/// Whether the optimizer still looks as `cache` recorded; if so the spans'
/// data pointers are refreshed.
bool refresh_cache(GradCache& cache, const torch::optim::Optimizer& optimizer);

/// A valid cache if every gradient is cacheable, else an invalid one. Throws
/// nothing: gradients that must be refused are left to the general path.
GradCache build_cache(const torch::optim::Optimizer& optimizer);

}  // namespace detail

struct detail::GradCaches::Map {
  std::unordered_map<const torch::optim::Optimizer*, detail::GradCache> caches;
};

}  // namespace torchamp
