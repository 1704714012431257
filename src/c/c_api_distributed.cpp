// The C ABI's process groups and DDP: torchamp::init_process_group,
// set_process_group and DistributedDataParallel over a module made of the
// caller's parameters. Without distributed support every call here that
// returns a status fails with TORCHAMP_NOT_IMPLEMENTED_ERROR, before any
// other check.

#include "c/handles.h"

#include <torchamp/config.h>

#if TORCHAMP_WITH_DISTRIBUTED
#include <torchamp/data_parallel.h>
#include <torchamp/distributed.h>
#include <torchamp/process_group.h>

#include <torch/nn/module.h>

#include <optional>
#include <string>

struct torchamp_process_group {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

struct torchamp_ddp {
  explicit torchamp_ddp(torchamp::DistributedDataParallel d) : ddp(std::move(d)) {}
  torchamp::DistributedDataParallel ddp;
  // Held while torchamp_ddp_set_sync(ddp, 0) is in force (after ddp: ends first).
  std::optional<torchamp::DistributedDataParallel::NoSync> no_sync;
};
#else
struct torchamp_process_group {};
struct torchamp_ddp {};
#endif

using namespace torchamp::c_api;  // NOLINT: this file is the ABI's implementation

namespace {

void require_distributed(const char* function) {
#if TORCHAMP_WITH_DISTRIBUTED
  (void)function;
#else
  TORCH_CHECK_NOT_IMPLEMENTED(false, function,
                              ": this torchamp was built without distributed support "
                              "(TORCHAMP_WITH_DISTRIBUTED=OFF)");
#endif
}

}  // namespace

extern "C" {

torchamp_status torchamp_init_process_group(const char* backend, const char* init_method,
                                            int32_t rank, int32_t world_size,
                                            torchamp_process_group** out) {
  return make_into(out, "torchamp_init_process_group", [&] {
    require_distributed("torchamp_init_process_group");
    auto handle = std::make_unique<torchamp_process_group>();
#if TORCHAMP_WITH_DISTRIBUTED
    torchamp::ProcessGroupOptions options;
    options.backend(backend != nullptr ? backend : "").rank(rank).world_size(world_size);
    if (init_method != nullptr) {
      options.init_method(std::string(init_method));
    }
    handle->group = torchamp::init_process_group(options);
#else
    (void)backend, (void)init_method, (void)rank, (void)world_size;
#endif
    return handle;
  });
}

torchamp_status torchamp_process_group_rank(const torchamp_process_group* group, int32_t* rank) {
  return guarded([&] {
    require_distributed("torchamp_process_group_rank");
    const auto& g = need(group, "torchamp_process_group_rank", "group");
    need(rank, "torchamp_process_group_rank", "rank");
#if TORCHAMP_WITH_DISTRIBUTED
    *rank = g.group->getRank();
#else
    (void)g;
#endif
  });
}

torchamp_status torchamp_process_group_size(const torchamp_process_group* group, int32_t* size) {
  return guarded([&] {
    require_distributed("torchamp_process_group_size");
    const auto& g = need(group, "torchamp_process_group_size", "group");
    need(size, "torchamp_process_group_size", "size");
#if TORCHAMP_WITH_DISTRIBUTED
    *size = g.group->getSize();
#else
    (void)g;
#endif
  });
}

void torchamp_process_group_free(torchamp_process_group* group) {
  delete group;
}

torchamp_status torchamp_destroy_process_group(void) {
  return guarded([&] {
    require_distributed("torchamp_destroy_process_group");
#if TORCHAMP_WITH_DISTRIBUTED
    torchamp::destroy_process_group();
#endif
  });
}

torchamp_status torchamp_scaler_set_process_group(torchamp_scaler* scaler,
                                                  torchamp_process_group* group) {
  return guarded([&] {
    require_distributed("torchamp_scaler_set_process_group");
    auto& s = need(scaler, "torchamp_scaler_set_process_group", "scaler");
#if TORCHAMP_WITH_DISTRIBUTED
    auto g = group != nullptr ? group->group : c10::intrusive_ptr<c10d::ProcessGroup>();
    s.visit([&](auto& sc) { torchamp::set_process_group(sc, g); });
#else
    (void)s, (void)group;
#endif
  });
}

void torchamp_ddp_options_default(torchamp_ddp_options* options) {
  if (options != nullptr) {
    *options = torchamp_ddp_options{0.0, 0, 0, 1, 0};
  }
}

torchamp_status torchamp_ddp_new(torchamp_process_group* group, torchamp_tensor* const* params,
                                 size_t count, const torchamp_ddp_options* options,
                                 torchamp_ddp** out) {
  return make_into(out, "torchamp_ddp_new", [&]() -> std::unique_ptr<torchamp_ddp> {
    require_distributed("torchamp_ddp_new");
    auto& g = need(group, "torchamp_ddp_new", "group");
    std::vector<at::Tensor> tensors = tensors_of(params, count, "torchamp_ddp_new", "params");
#if TORCHAMP_WITH_DISTRIBUTED
    torchamp_ddp_options o;
    torchamp_ddp_options_default(&o);
    if (options != nullptr) {
      o = *options;
    }
    torchamp::DistributedDataParallelOptions ddp_options;
    ddp_options.find_unused_parameters(o.find_unused_parameters != 0)
        .gradient_as_bucket_view(o.gradient_as_bucket_view != 0)
        .average_gradients(o.average_gradients != 0);
    if (o.bucket_cap_mb > 0) {
      ddp_options.bucket_cap_mb(o.bucket_cap_mb);
    }
    // A module that holds the caller's tensors themselves (no copies), named
    // by position as the Reducer needs names only for its messages.
    auto module = std::make_shared<torch::nn::Module>("torchamp_c_parameters");
    for (size_t i = 0; i < tensors.size(); ++i) {
      module->register_parameter(std::to_string(i), tensors[i], tensors[i].requires_grad());
    }
    return std::make_unique<torchamp_ddp>(
        torchamp::DistributedDataParallel(module, g.group, ddp_options));
#else
    (void)g, (void)options;
    return nullptr;
#endif
  });
}

torchamp_status torchamp_ddp_prepare_backward(torchamp_ddp* ddp, torchamp_tensor* const* outputs,
                                              size_t count) {
  return guarded([&] {
    require_distributed("torchamp_ddp_prepare_backward");
    auto& d = need(ddp, "torchamp_ddp_prepare_backward", "ddp");
    std::vector<at::Tensor> tensors =
        tensors_of(outputs, count, "torchamp_ddp_prepare_backward", "outputs");
#if TORCHAMP_WITH_DISTRIBUTED
    // The forward already ran in the caller's binding: DDP's work before and
    // after it (the module has no buffers to broadcast first).
    d.ddp.forward([&] { return tensors; });
#else
    (void)d;
#endif
  });
}

torchamp_status torchamp_ddp_set_sync(torchamp_ddp* ddp, int32_t sync) {
  return guarded([&] {
    require_distributed("torchamp_ddp_set_sync");
    auto& d = need(ddp, "torchamp_ddp_set_sync", "ddp");
    TORCH_CHECK_VALUE(sync == 0 || sync == 1, "torchamp_ddp_set_sync: sync must be 0 or 1, got ",
                      sync);
#if TORCHAMP_WITH_DISTRIBUTED
    if (sync == 0 && !d.no_sync) {
      d.no_sync.emplace(d.ddp.no_sync());
    } else if (sync == 1) {
      d.no_sync.reset();
    }
#else
    (void)d;
#endif
  });
}

torchamp_status torchamp_ddp_bucket_indices(torchamp_ddp* ddp, int64_t* sizes, size_t* bucket_count,
                                            int64_t* indices, size_t index_capacity) {
  return guarded([&] {
    require_distributed("torchamp_ddp_bucket_indices");
    auto& d = need(ddp, "torchamp_ddp_bucket_indices", "ddp");
    size_t& count = need(bucket_count, "torchamp_ddp_bucket_indices", "bucket_count");
#if TORCHAMP_WITH_DISTRIBUTED
    const auto buckets = d.ddp.bucket_indices();
    if (sizes == nullptr) {
      count = buckets.size();
      return;
    }
    const size_t params = d.ddp.parameters().size();
    TORCH_CHECK_VALUE(count >= buckets.size(), "torchamp_ddp_bucket_indices: there are ",
                      buckets.size(), " buckets, and *bucket_count gives room for ", count);
    TORCH_CHECK_TYPE(indices != nullptr, "torchamp_ddp_bucket_indices: indices is NULL");
    TORCH_CHECK_VALUE(index_capacity >= params, "torchamp_ddp_bucket_indices: there are ", params,
                      " parameters, and indices has room for ", index_capacity);
    size_t at = 0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      sizes[b] = static_cast<int64_t>(buckets[b].size());
      for (const size_t i : buckets[b]) {
        indices[at++] = static_cast<int64_t>(i);
      }
    }
    count = buckets.size();
#else
    (void)d, (void)count, (void)sizes, (void)indices, (void)index_capacity;
#endif
  });
}

torchamp_status torchamp_ddp_set_bucket_indices(torchamp_ddp* ddp, const int64_t* sizes,
                                                size_t bucket_count, const int64_t* indices,
                                                size_t index_count) {
  return guarded([&] {
    require_distributed("torchamp_ddp_set_bucket_indices");
    auto& d = need(ddp, "torchamp_ddp_set_bucket_indices", "ddp");
    TORCH_CHECK_TYPE(bucket_count == 0 || sizes != nullptr,
                     "torchamp_ddp_set_bucket_indices: sizes is NULL");
    TORCH_CHECK_TYPE(index_count == 0 || indices != nullptr,
                     "torchamp_ddp_set_bucket_indices: indices is NULL");
    TORCH_CHECK_VALUE(bucket_count <= index_count,
                      "torchamp_ddp_set_bucket_indices: ", bucket_count, " buckets of ",
                      index_count, " indices (a bucket holds one or more)");
    std::vector<std::vector<size_t>> buckets(bucket_count);
    size_t at = 0;
    for (size_t b = 0; b < bucket_count; ++b) {
      TORCH_CHECK_VALUE(sizes[b] >= 0 && static_cast<size_t>(sizes[b]) <= index_count - at,
                        "torchamp_ddp_set_bucket_indices: sizes[", b, "] is ", sizes[b], ", but ",
                        index_count - at, " of the ", index_count, " indices are left");
      for (int64_t k = 0; k < sizes[b]; ++k, ++at) {
        TORCH_CHECK_VALUE(indices[at] >= 0, "torchamp_ddp_set_bucket_indices: indices[", at,
                          "] is ", indices[at]);
        buckets[b].push_back(static_cast<size_t>(indices[at]));
      }
    }
    TORCH_CHECK_VALUE(at == index_count, "torchamp_ddp_set_bucket_indices: the sizes add up to ",
                      at, ", but index_count is ", index_count);
#if TORCHAMP_WITH_DISTRIBUTED
    d.ddp.set_bucket_indices(std::move(buckets));
#else
    (void)d;
#endif
  });
}

void torchamp_ddp_free(torchamp_ddp* ddp) {
  delete ddp;
}

}  // extern "C"
