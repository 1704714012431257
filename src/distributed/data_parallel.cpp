// torchamp::DistributedDataParallel: what Python's DistributedDataParallel
// (torch/nn/parallel/distributed.py) does around c10d's Reducer, in C++. The
// Reducer does the work (buckets, autograd hooks, all-reduce during backward,
// unused-parameter search, copying the result back); this file builds its
// arguments the way Python does and calls it at the points Python does.
#include <torchamp/data_parallel.h>

#include "compat/compat.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/embedding.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_set>

namespace torchamp {

namespace detail {
void collect_tensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    collect_tensors(v.toTensor(), out);
  } else if (v.isTensorList()) {
    collect_tensors(v.toTensorVector(), out);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      collect_tensors(e, out);
    }
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      collect_tensors(e, out);
    }
  } else if (v.isGenericDict()) {
    for (const auto& e : v.toGenericDict()) {
      collect_tensors(e.value(), out);
    }
  }
}
}  // namespace detail

namespace {

constexpr int64_t kMiB = 1024 * 1024;
// Python's defaults: dist._DEFAULT_FIRST_BUCKET_BYTES, _DEFAULT_BUCKET_CAP_MB
// and DDP's broadcast_bucket_size.
constexpr int64_t kFirstBucketBytes = 1 * kMiB;
constexpr double kDefaultBucketCapMb = 25;
constexpr size_t kBroadcastBucketBytes = 250 * kMiB;

// The all-reduce of one bucket, as a communication hook (the Reducer calls
// it when the bucket is full). Two reasons to be one rather than the
// Reducer's built-in all-reduce:
//  - summing (average_gradients false): the built-in always averages;
//  - a failed all-reduce (a rank died, the group timed out) comes out of
//    backward() naming the collective, the bucket and this rank.
// Averaging here is the built-in's own arithmetic: the Reducer copies each
// gradient into the bucket (it divides while copying only without a hook),
// and this multiplies by the same wrapped 1/world scalar before the SUM.
// That holds for dense gradients copied into the bucket; sparse gradients
// and gradient_as_bucket_view (where the built-in divides in place instead)
// keep the built-in when averaging, so their values stay Python's too.
class BucketAllReduce final : public c10d::CommHookInterface {
 public:
  BucketAllReduce(c10::intrusive_ptr<c10d::ProcessGroup> group, bool average)
      : group_(std::move(group)), average_(average) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor& buffer = bucket.getBufferRef();
    if (average_) {
      const double inverse = 1.0 / static_cast<double>(group_->getSize());
      at::Tensor wrapped = at::scalar_tensor(inverse, at::kDouble);
      wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
      at::mul_out(buffer, buffer, wrapped);
    }
    std::vector<at::Tensor> tensors = {buffer};
    const size_t index = bucket.getIndex();
    const int rank = group_->getRank(), world = group_->getSize();
    auto future = group_->allreduce(tensors)->getFuture();
    return future->then(
        [index, rank, world](c10::ivalue::Future& done) -> c10::IValue {
          try {
            return done.value();
          } catch (const std::exception& e) {
            const auto* c = dynamic_cast<const c10::Error*>(&e);
            TORCH_CHECK(false,
                        "torchamp::DistributedDataParallel: the all-reduce of gradient "
                        "bucket ",
                        index, " over the process group failed on rank ", rank, " of ", world,
                        " (another rank died, or did not arrive within the group's timeout): ",
                        c != nullptr ? c->what_without_backtrace() : e.what());
          }
        },
        future->elementType());
  }

  at::Tensor parseHookResult(const c10::IValue& result) override {
    // What ProcessGroup::allreduce's future holds: the list of its tensors.
    return result.isTensor() ? result.toTensor() : result.toTensorVector().front();
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  bool average_;
};

// Python's _build_params_for_reducer: each module depth first, its own
// parameters that require gradients, each parameter once; whether its module
// makes sparse gradients (Embedding and EmbeddingBag with sparse).
void reducer_parameters(torch::nn::Module& root, std::vector<at::Tensor>& params,
                        std::vector<bool>& sparse, std::unordered_map<size_t, std::string>& names) {
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    const torch::nn::Module& m = *item.value();
    bool module_sparse = false;
    if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) {
      module_sparse = e->options.sparse();
    } else if (const auto* b = dynamic_cast<const torch::nn::EmbeddingBagImpl*>(&m)) {
      module_sparse = b->options.sparse();
    }
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (!p.value().requires_grad() || !seen.insert(p.value().unsafeGetTensorImpl()).second) {
        continue;
      }
      names[params.size()] = item.key().empty() ? p.key() : item.key() + "." + p.key();
      params.push_back(p.value());
      sparse.push_back(module_sparse);
    }
  }
}

// The Reducer's "Expected to have finished reduction in the prior
// iteration" speaks Python (`find_unused_parameters=True` to
// `torch.nn.parallel.DistributedDataParallel`) and names parameters by
// index. Runs `step`; that error comes back with the C++ option and the
// parameters' names first, and c10d's own text after them.
template <class Step>
void naming_unready(const std::vector<std::string>& names, const Step& step) {
  try {
    step();
  } catch (const c10::Error& e) {
    const std::string text = e.what_without_backtrace();
    if (text.find("Expected to have finished reduction in the prior iteration") ==
        std::string::npos) {
      throw;
    }
    // "Parameter indices which did not receive grad for rank R: 2 3"
    std::string unready;
    const std::string marker = "did not receive grad for rank ";
    if (const auto at = text.find(marker); at != std::string::npos) {
      const auto colon = text.find(':', at);
      std::stringstream list(text.substr(colon + 1, text.find('\n', colon) - colon - 1));
      for (size_t i = 0; list >> i;) {
        unready += (unready.empty() ? "" : ", ") +
                   (i < names.size() ? names[i] : "#" + std::to_string(i)) + " (index " +
                   std::to_string(i) + ")";
      }
    }
    TORCH_CHECK(false, "torchamp::DistributedDataParallel: the previous iteration's backward left ",
                unready.empty() ? std::string("some parameters without a gradient")
                                : "these parameters without a gradient: " + unready,
                ". A model whose forward leaves parameters out of the loss needs "
                "DistributedDataParallelOptions().find_unused_parameters(true); or make every "
                "parameter take part in the loss (indices are into ddp.parameters()).\n",
                text);
  }
}

}  // namespace

using Layout = std::vector<std::vector<size_t>>;
// A gradient accumulator: a shared_ptr before LibTorch 2.x's intrusive_ptr.
using NodePtr = decltype(torch::autograd::impl::try_get_grad_accumulator(at::Tensor()));

struct DistributedDataParallel::Impl {
  std::shared_ptr<torch::nn::Module> module;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  DistributedDataParallelOptions options;
  std::vector<at::Tensor> params;
  std::vector<bool> sparse;        // of params: from a module with sparse gradients
  std::vector<std::string> names;  // of params, as named_parameters() names them
  std::shared_ptr<c10d::Reducer> reducer;
  // Each parameter's gradient accumulator when the Reducer hooked it (the
  // Reducer keeps them alive, so an address is not reused while it lives).
  std::vector<const torch::autograd::Node*> hooked;
  bool require_backward_grad_sync = true;
  bool require_forward_param_sync = true;
  // set_bucket_indices' layout, for the Reducer the next forward makes.
  std::optional<Layout> next_buckets;
  // Whether the Reducer has rebuilt its buckets (it does once, without
  // find_unused_parameters, at the forward after its first reduced backward).
  bool rebuilt = false;
  // Until then, the order that backward's gradients arrived in (parameter
  // indices), recorded by a post hook beside the Reducer's on each gradient
  // accumulator: the rebuild's layout, known before the Reducer makes it,
  // for a checkpoint saved in between.
  std::vector<int64_t> arrival;
  mutable std::mutex arrival_mutex;  // hooks may run on the engine's device threads
  std::atomic<bool> recording{false};
  std::vector<std::pair<NodePtr, uintptr_t>> arrival_hooks;

  ~Impl() { unhook_arrivals(); }
  std::pair<int64_t, int64_t> bucket_caps() const;  // first bucket's, others'
  void make_reducer(std::optional<Layout> layout = std::nullopt);
  bool hooks_lost() const;
  Layout current_buckets() const;
  std::optional<std::string> layout_error(const Layout& buckets) const;
  Layout rank0_layout(const Layout& layout) const;
  void arrived(size_t index);
  void hook_arrivals();
  void unhook_arrivals();
  std::optional<Layout> predicted_rebuild() const;
};

// The first bucket's cap and the others' (bytes), as Python's DDP sets them.
std::pair<int64_t, int64_t> DistributedDataParallel::Impl::bucket_caps() const {
  const auto cap_mb = options.bucket_cap_mb();
  const int64_t bucket_bytes =
      static_cast<int64_t>(cap_mb.value_or(kDefaultBucketCapMb) * static_cast<double>(kMiB));
  return {cap_mb ? bucket_bytes : kFirstBucketBytes, bucket_bytes};
}

// Python's _BucketCapacityConfig and _ddp_init_helper: without
// find_unused_parameters, one bucket for the first iteration, rebuilt from
// the order gradients arrived in; buckets reversed (reduced last first).
// Makes the Reducer of `d`'s parameters, with its all-reduce, and what it
// hooked; changes nothing where it throws. `layout`: these buckets instead
// (layout_error found none), for its first iteration; without
// find_unused_parameters it rebuilds after it as ever, from the order the
// gradients come in, which is the order that made such a layout.
void DistributedDataParallel::Impl::make_reducer(std::optional<Layout> layout) {
  Impl& d = *this;
  const auto [first_bucket_bytes, bucket_bytes] = d.bucket_caps();
  Layout buckets;
  std::vector<size_t> bucket_limits;
  if (layout) {  // (the limits are the Reducer's logging only)
    bucket_limits.assign(layout->size(), static_cast<size_t>(bucket_bytes));
    buckets = std::move(*layout);
  } else {
    std::vector<size_t> limits;
    if (!d.options.find_unused_parameters()) {
      limits = {static_cast<size_t>(std::numeric_limits<int64_t>::max())};
    } else if (first_bucket_bytes < bucket_bytes) {
      limits = {static_cast<size_t>(first_bucket_bytes), static_cast<size_t>(bucket_bytes)};
    } else {
      limits = {static_cast<size_t>(bucket_bytes)};
    }
    std::tie(buckets, bucket_limits) =
        c10d::compute_bucket_assignment_by_size(d.params, limits, d.sparse);
    std::reverse(buckets.begin(), buckets.end());
    std::reverse(bucket_limits.begin(), bucket_limits.end());
  }
  std::unordered_map<size_t, std::string> names;
  for (size_t i = 0; i < d.names.size(); ++i) {
    names[i] = d.names[i];
  }
  auto reducer = compat::make_reducer<c10d::Reducer>(
      d.params, std::move(buckets), std::move(bucket_limits), d.group, d.sparse, bucket_bytes,
      d.options.find_unused_parameters(), d.options.gradient_as_bucket_view(), std::move(names),
      first_bucket_bytes);
  const bool any_sparse = std::find(d.sparse.begin(), d.sparse.end(), true) != d.sparse.end();
  if (!d.options.average_gradients() || (!any_sparse && !d.options.gradient_as_bucket_view())) {
    reducer->register_comm_hook(
        std::make_unique<BucketAllReduce>(d.group, d.options.average_gradients()));
  }
  std::vector<const torch::autograd::Node*> hooked;
  hooked.reserve(d.params.size());
  for (const auto& p : d.params) {
    hooked.push_back(torch::autograd::impl::try_get_grad_accumulator(p).get());
  }
  d.unhook_arrivals();
  d.recording = false;
  {
    std::lock_guard<std::mutex> lock(d.arrival_mutex);
    d.arrival.clear();  // (the old Reducer's order foretells nothing of the new one)
  }
  d.reducer = std::move(reducer);
  d.hooked = std::move(hooked);
  d.rebuilt = false;
  if (!d.options.find_unused_parameters()) {  // (which never rebuilds)
    d.hook_arrivals();
  }
}

// Whether a parameter has another gradient accumulator than the one the
// Reducer hooked: LibTorch's Module::load and torch::load `set_` each
// parameter to the loaded tensor, and Module::to `set_data`s it to another
// dtype or device; both drop the parameter's accumulator, and with it the
// Reducer's hook (its gradient would never be reduced).
bool DistributedDataParallel::Impl::hooks_lost() const {
  const Impl& d = *this;
  for (size_t i = 0; i < d.params.size(); ++i) {
    if (torch::autograd::impl::try_get_grad_accumulator(d.params[i]).get() != d.hooked[i]) {
      return true;
    }
  }
  return false;
}

std::vector<std::vector<size_t>> DistributedDataParallel::Impl::current_buckets() const {
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) {
    index[params[i].unsafeGetTensorImpl()] = i;
  }
  std::vector<std::vector<size_t>> out;
  for (const auto& bucket : reducer->get_grad_buckets(/*return_zero_tensors=*/false)) {
    out.emplace_back();
    for (const auto& p : bucket.getParameters()) {
      out.back().push_back(index.at(p.unsafeGetTensorImpl()));
    }
  }
  return out;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                 DistributedDataParallelOptions options)
    : impl_(std::make_unique<Impl>()) {
  TORCH_CHECK_VALUE(module != nullptr, "DistributedDataParallel: the module is null");
  TORCH_CHECK_VALUE(group, "DistributedDataParallel: the process group is null");
  const auto cap_mb = options.bucket_cap_mb();
  TORCH_CHECK_VALUE(!cap_mb || *cap_mb > 0,
                    "DistributedDataParallel: bucket_cap_mb must be "
                    "positive, got ",
                    cap_mb.value_or(0));
  Impl& d = *impl_;
  d.module = std::move(module);
  d.group = std::move(group);
  d.options = options;
  std::unordered_map<size_t, std::string> names;
  reducer_parameters(*d.module, d.params, d.sparse, names);
  TORCH_CHECK(!d.params.empty(),
              "DistributedDataParallel is not needed when a module doesn't have any parameter "
              "that requires a gradient.");
  d.names.resize(d.params.size());
  for (const auto& [index, name] : names) {
    d.names[index] = name;
  }

  // Python's _verify_param_shape_across_processes and _sync_module_states.
  c10d::verify_params_across_processes(d.group, d.params, {});
  {
    std::vector<at::Tensor> states;
    for (const auto& p : d.module->parameters()) {
      states.push_back(p.detach());
    }
    if (options.broadcast_buffers()) {
      for (const auto& b : d.module->buffers()) {
        states.push_back(b.detach());
      }
    }
    c10d::broadcast_coalesced(d.group, states, kBroadcastBucketBytes, 0);
  }
  d.make_reducer();
}

DistributedDataParallel::~DistributedDataParallel() = default;
DistributedDataParallel::DistributedDataParallel(DistributedDataParallel&&) noexcept = default;
DistributedDataParallel& DistributedDataParallel::operator=(DistributedDataParallel&&) noexcept =
    default;

void DistributedDataParallel::pre_forward_() {
  Impl& d = *impl_;
  const bool grad = at::GradMode::is_enabled();
  if (grad) {
    d.recording = false;  // (the Reducer rebuilds from one backward)
  }
  // Parameters loaded (or moved) since the Reducer was made: a new one hooks
  // their new accumulators, over the buckets the old one had (or those
  // set_bucket_indices gave), so each gradient is added in the same place
  // of the same all-reduce as before. Local: every rank loads alike, so
  // every rank makes its own at the same forward.
  if (grad && (d.hooks_lost() || d.next_buckets)) {
    for (size_t i = 0; i < d.params.size(); ++i) {  // the Reducer hooks each: it needs gradients
      TORCH_CHECK(d.params[i].requires_grad(), "torchamp::DistributedDataParallel: parameter ",
                  d.names[i], " (index ", i,
                  ") was loaded or moved since this DDP was built and no longer requires a "
                  "gradient, so it cannot be hooked again; build a new DistributedDataParallel "
                  "over the module as it is now. Nothing was changed.");
    }
    if (d.next_buckets) {  // a parameter may have changed its dtype or device since
      const auto error = d.layout_error(*d.next_buckets);
      TORCH_CHECK_VALUE(!error,
                        "torchamp::DistributedDataParallel: the buckets set_bucket_indices gave "
                        "(rank 0's) no longer fit the parameters: ",
                        error.value_or(""), ". Nothing was changed.");
    }
    // What the old Reducer would still raise (a reduction the previous
    // iteration left unfinished), before it goes.
    naming_unready(d.names, [&] { d.reducer->rebuild_buckets(); });
    std::optional<Layout> layout = d.next_buckets;
    if (!layout) {  // the old one's, where they still fit (Module::to may part a bucket)
      layout = d.current_buckets();
      if (d.layout_error(*layout)) {
        layout.reset();
      }
    }
    d.make_reducer(std::move(layout));
    d.next_buckets.reset();
  }
  naming_unready(d.names, [&] {
    if (grad && d.require_backward_grad_sync) {
      d.reducer->prepare_for_forward();
    }
    // Once, after the first iteration: buckets in the order gradients came.
    if (grad) {
      const auto predicted = d.predicted_rebuild();
      if (d.reducer->rebuild_buckets()) {
        d.rebuilt = true;
        d.unhook_arrivals();
        if (predicted && *predicted != d.current_buckets()) {
          TORCH_WARN_ONCE(
              "torchamp::DistributedDataParallel: the Reducer rebuilt its buckets otherwise than "
              "bucket_indices() said it would; a checkpoint saved after the first iteration "
              "holds the buckets from that prediction, and a run resumed from it may differ in "
              "the last bits on more than two ranks");
        }
      }
    }
  });
  if (d.require_forward_param_sync && d.options.broadcast_buffers()) {
    std::vector<at::Tensor> buffers = d.module->buffers();
    if (!buffers.empty()) {
      torch::NoGradGuard no_grad;
      for (auto& b : buffers) {
        b = b.detach();
      }
      c10d::broadcast_coalesced(d.group, buffers, kBroadcastBucketBytes, 0);
    }
  }
}

bool DistributedDataParallel::wants_outputs_() const {
  return impl_->options.find_unused_parameters() && impl_->require_backward_grad_sync &&
         at::GradMode::is_enabled();
}

void DistributedDataParallel::post_forward_(const std::vector<at::Tensor>& outputs) {
  Impl& d = *impl_;
  if (at::GradMode::is_enabled() && d.require_backward_grad_sync) {
    d.require_forward_param_sync = true;
    naming_unready(d.names, [&] {
      d.reducer->prepare_for_backward(
          d.options.find_unused_parameters() ? outputs : std::vector<at::Tensor>{});
    });
    if (!d.arrival_hooks.empty()) {  // (until the rebuild) the backward it rebuilds from
      std::lock_guard<std::mutex> lock(d.arrival_mutex);
      d.arrival.clear();
      d.recording = true;
    }
  } else {
    d.require_forward_param_sync = false;
  }
}

DistributedDataParallel::NoSync DistributedDataParallel::no_sync(bool enabled) {
  const bool previous = impl_->require_backward_grad_sync;
  impl_->require_backward_grad_sync = previous && !enabled;
  return NoSync(&impl_->require_backward_grad_sync, previous);
}

DistributedDataParallel::NoSync::NoSync(NoSync&& other) noexcept
    : flag_(std::exchange(other.flag_, nullptr)), previous_(other.previous_) {}

DistributedDataParallel::NoSync::~NoSync() {
  if (flag_ != nullptr) {
    *flag_ = previous_;
  }
}

bool DistributedDataParallel::require_backward_grad_sync() const {
  return impl_->require_backward_grad_sync;
}
const std::shared_ptr<torch::nn::Module>& DistributedDataParallel::module() const {
  return impl_->module;
}
const c10::intrusive_ptr<c10d::ProcessGroup>& DistributedDataParallel::process_group() const {
  return impl_->group;
}
const DistributedDataParallelOptions& DistributedDataParallel::options() const {
  return impl_->options;
}
const std::vector<at::Tensor>& DistributedDataParallel::parameters() const {
  return impl_->params;
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_indices() const {
  if (impl_->next_buckets) {
    return *impl_->next_buckets;
  }
  const Impl& d = *impl_;
  if (auto predicted = d.predicted_rebuild()) {
    return *predicted;
  }
  if (!d.rebuilt && !d.options.find_unused_parameters()) {
    std::lock_guard<std::mutex> lock(d.arrival_mutex);
    if (!d.arrival.empty()) {  // a backward ran, but its order is not whole
      TORCH_WARN_ONCE(
          "torchamp::DistributedDataParallel::bucket_indices(): the Reducer rebuilds its "
          "buckets at the next forward, from an order of gradients this DDP could not record "
          "whole; these are the buckets before it, which a run resumed from them would reduce "
          "its first step in (the last bits may differ on more than two ranks)");
    }
  }
  return d.current_buckets();
}

// What makes `buckets` unfit for a Reducer over the parameters as they are
// now: not each parameter once, an empty bucket, a sparse one shared, or
// dtypes or devices mixed.
std::optional<std::string> DistributedDataParallel::Impl::layout_error(
    const Layout& buckets) const {
  const size_t n = params.size();
  std::vector<int64_t> bucket_of(n, -1);
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (buckets[b].empty()) {
      return c10::str("bucket ", b, " is empty");
    }
    for (const size_t i : buckets[b]) {
      if (i >= n) {
        return c10::str("bucket ", b, " holds index ", i, ", but there are ", n,
                        " parameters (indices into parameters())");
      }
      if (bucket_of[i] >= 0) {
        return bucket_of[i] == static_cast<int64_t>(b)
                   ? c10::str("index ", i, " (", names[i], ") is in bucket ", b, " twice")
                   : c10::str("index ", i, " (", names[i], ") is in bucket ", bucket_of[i],
                              " and in bucket ", b);
      }
      bucket_of[i] = static_cast<int64_t>(b);
      if (sparse[i] && buckets[b].size() != 1) {
        return c10::str("index ", i, " (", names[i],
                        ") makes sparse gradients and needs a bucket of its own; bucket ", b,
                        " holds ", buckets[b].size(), " parameters");
      }
      const at::Tensor& first = params[buckets[b].front()];
      if (params[i].dtype() != first.dtype() || params[i].device() != first.device()) {
        return c10::str("bucket ", b, " mixes ", names[i], " (", params[i].dtype(), " on ",
                        params[i].device(), ") with ", names[buckets[b].front()], " (",
                        first.dtype(), " on ", first.device(), ")");
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (bucket_of[i] < 0) {
      return c10::str("index ", i, " (", names[i], ") is in no bucket; every one of the ", n,
                      " parameters() must be in one");
    }
  }
  return std::nullopt;
}

// Rank 0's `layout`, on every rank (a collective): ranks given other
// buckets would all-reduce buffers that do not match, so, as the Reducer's
// rebuild does, every rank takes rank 0's.
Layout DistributedDataParallel::Impl::rank0_layout(const Layout& layout) const {
  const auto device = params.front().device();
  int64_t total = 0;
  for (const auto& b : layout) {
    total += static_cast<int64_t>(b.size());
  }
  at::Tensor header = at::empty({2}, at::kLong);
  header.data_ptr<int64_t>()[0] = static_cast<int64_t>(layout.size());
  header.data_ptr<int64_t>()[1] = total;
  std::vector<at::Tensor> message = {header.to(device)};
  c10d::broadcast_coalesced(group, message, kBroadcastBucketBytes, 0);
  header = message.front().cpu();
  const int64_t buckets = header.data_ptr<int64_t>()[0], indices = header.data_ptr<int64_t>()[1];
  // Each bucket's size, then every bucket's indices in turn (only rank 0's
  // are sent: the others' are overwritten).
  at::Tensor flat = at::zeros({buckets + indices}, at::kLong);
  if (buckets == static_cast<int64_t>(layout.size()) && indices == total) {
    int64_t* out = flat.data_ptr<int64_t>();
    int64_t at = buckets;
    for (size_t b = 0; b < layout.size(); ++b) {
      out[b] = static_cast<int64_t>(layout[b].size());
      for (const size_t i : layout[b]) {
        out[at++] = static_cast<int64_t>(i);
      }
    }
  }
  message = {flat.to(device)};
  c10d::broadcast_coalesced(group, message, kBroadcastBucketBytes, 0);
  flat = message.front().cpu();
  const int64_t* in = flat.data_ptr<int64_t>();
  Layout out(static_cast<size_t>(buckets));
  int64_t at = buckets;
  for (int64_t b = 0; b < buckets; ++b) {
    for (int64_t k = 0; k < in[b]; ++k) {
      out[static_cast<size_t>(b)].push_back(static_cast<size_t>(in[at++]));
    }
  }
  return out;
}

namespace {
// Beside the Reducer's own post hook on a gradient accumulator, called as it
// is (the same node call, whether or not a gradient came): records the
// order the Reducer's rebuild will use.
class ArrivalHook final : public torch::autograd::FunctionPostHook {
 public:
  ArrivalHook(std::function<void()> arrived) : arrived_(std::move(arrived)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    arrived_();
    return outputs;
  }

 private:
  std::function<void()> arrived_;
};
}  // namespace

void DistributedDataParallel::Impl::arrived(size_t index) {
  if (recording) {
    std::lock_guard<std::mutex> lock(arrival_mutex);
    arrival.push_back(static_cast<int64_t>(index));
  }
}

// A hook on each accumulator the Reducer hooked, once per Reducer, until it
// rebuilds (none where one is missing: no prediction then).
void DistributedDataParallel::Impl::hook_arrivals() {
  std::vector<NodePtr> nodes;
  for (const auto& p : params) {
    nodes.push_back(torch::autograd::impl::try_get_grad_accumulator(p));
    if (!nodes.back()) {
      return;
    }
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const uintptr_t key =
        nodes[i]->add_post_hook(std::make_unique<ArrivalHook>([this, i] { arrived(i); }));
    arrival_hooks.emplace_back(std::move(nodes[i]), key);
  }
}

void DistributedDataParallel::Impl::unhook_arrivals() {
  for (auto& [node, key] : arrival_hooks) {
    node->del_post_hook(key);
  }
  arrival_hooks.clear();
}

// The buckets the Reducer's pending rebuild will make: its own computation
// (Reducer::rebuild_buckets) on the recorded order; none where no rebuild
// is pending or the order is not whole.
std::optional<Layout> DistributedDataParallel::Impl::predicted_rebuild() const {
  if (rebuilt || options.find_unused_parameters()) {
    return std::nullopt;
  }
  std::vector<int64_t> order;
  {
    std::lock_guard<std::mutex> lock(arrival_mutex);
    order = arrival;
  }
  // The first backward's: each parameter once (a later backward of the same
  // graph, with retain_graph, comes after the Reducer stopped recording).
  if (order.size() < params.size()) {
    return std::nullopt;
  }
  order.resize(params.size());
  std::vector<bool> seen(params.size(), false);
  for (const int64_t i : order) {
    if (seen[static_cast<size_t>(i)]) {
      return std::nullopt;
    }
    seen[static_cast<size_t>(i)] = true;
  }
  const auto [first_bucket_bytes, bucket_bytes] = bucket_caps();
  const char* last_small = std::getenv("DDP_SET_LAST_BUCKET_CAP");
  const bool reversed = last_small != nullptr && std::string(last_small) == "1";
  if (reversed) {
    std::reverse(order.begin(), order.end());
  }
  std::vector<at::Tensor> tensors;
  for (const int64_t i : order) {
    tensors.push_back(params[static_cast<size_t>(i)]);
  }
  auto buckets = std::get<0>(c10d::compute_bucket_assignment_by_size(
      tensors, {static_cast<size_t>(first_bucket_bytes), static_cast<size_t>(bucket_bytes)}, sparse,
      order));
  if (reversed) {
    std::reverse(buckets.begin(), buckets.end());
  }
  return buckets;
}

void DistributedDataParallel::set_bucket_indices(std::vector<std::vector<size_t>> buckets) {
  Layout given = impl_->rank0_layout(buckets);
  const auto error = impl_->layout_error(given);  // rank 0's, alike on every rank
  TORCH_CHECK_VALUE(!error, "DistributedDataParallel::set_bucket_indices: ", error.value_or(""));
  impl_->next_buckets = std::move(given);
}

}  // namespace torchamp
