#pragma once

/// \file
/// `torchamp::DistributedDataParallel`: Python's
/// `torch.nn.parallel.DistributedDataParallel` for the LibTorch C++ frontend,
/// on the engine Python's runs on, c10d's `Reducer`. Each parameter's
/// gradient is written into a bucket as backward produces it, and a bucket's
/// all-reduce starts as soon as the bucket is full, while the rest of backward
/// runs. After backward every rank holds the same gradients (averaged, or
/// summed if asked), so every rank's `GradScaler` reaches the same decision
/// alone, as in Python: scaled gradients are reduced like any others.
///
/// ```cpp
/// torchamp::DistributedDataParallel ddp(model.ptr(), group);
/// auto out = ddp.forward([&] { return model->forward(x); });
/// scaler.scale(loss_fn(out, y)).backward();  // buckets all-reduced during backward
/// scaler.step(opt);
/// scaler.update();
/// ```
///
/// Differences from Python: `forward` takes the call of the module's own
/// forward (C++ modules have no common `forward` signature); one device per
/// process; no `static_graph`, communication hooks, `join`, mixed-precision
/// or ignored parameters yet.

#include <torchamp/config.h>

#if !TORCHAMP_WITH_DISTRIBUTED
#error "this torchamp was built with -DTORCHAMP_WITH_DISTRIBUTED=OFF: no process groups, no DDP"
#endif

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchamp {

/// Python's `DistributedDataParallel` arguments, with its names and defaults.
struct DistributedDataParallelOptions {
  /// Bucket size in MiB. Unset (Python's `None`): 25, with a first bucket of
  /// 1 MiB; set: every bucket this size, as in Python.
  TORCH_ARG(std::optional<double>, bucket_cap_mb) = std::nullopt;
  /// Broadcast the module's buffers from rank 0 before every forward.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Traverse the autograd graph from `forward`'s outputs and mark parameters
  /// it does not reach as ready, so models that skip some can train.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Gradients are views into the buckets (saves a copy and memory).
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// true (Python's default): gradients are averaged over the ranks. false:
  /// summed; weight each rank's loss by its share of the global batch and the
  /// sum is the global batch's gradient, with float16 activation gradients
  /// the size of a single process's (see docs/distributed.md, "DistributedDataParallel").
  TORCH_ARG(bool, average_gradients) = true;
};

namespace detail {
// The tensors in a forward's result, for find_unused_parameters (Python's
// _find_tensors): tensors, and those inside vectors, arrays, tuples, pairs,
// maps and IValues; anything else holds none.
template <class T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) {
  if (t.defined()) {
    out.push_back(t);
  }
}
void collect_tensors(const c10::IValue& v, std::vector<at::Tensor>& out);
template <class T, class A>
void collect_tensors(const std::vector<T, A>& v, std::vector<at::Tensor>& out);
template <class T, size_t N>
void collect_tensors(const std::array<T, N>& v, std::vector<at::Tensor>& out);
template <class A, class B>
void collect_tensors(const std::pair<A, B>& v, std::vector<at::Tensor>& out);
template <class... Ts>
void collect_tensors(const std::tuple<Ts...>& v, std::vector<at::Tensor>& out);
template <class K, class V, class... R>
void collect_tensors(const std::map<K, V, R...>& v, std::vector<at::Tensor>& out);
template <class K, class V, class... R>
void collect_tensors(const std::unordered_map<K, V, R...>& v, std::vector<at::Tensor>& out);

template <class T, class A>
void collect_tensors(const std::vector<T, A>& v, std::vector<at::Tensor>& out) {
  for (const auto& e : v) {
    collect_tensors(e, out);
  }
}
template <class T, size_t N>
void collect_tensors(const std::array<T, N>& v, std::vector<at::Tensor>& out) {
  for (const auto& e : v) {
    collect_tensors(e, out);
  }
}
template <class A, class B>
void collect_tensors(const std::pair<A, B>& v, std::vector<at::Tensor>& out) {
  collect_tensors(v.first, out);
  collect_tensors(v.second, out);
}
template <class... Ts>
void collect_tensors(const std::tuple<Ts...>& v, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collect_tensors(e, out), ...); }, v);
}
template <class K, class V, class... R>
void collect_tensors(const std::map<K, V, R...>& v, std::vector<at::Tensor>& out) {
  for (const auto& e : v) {
    collect_tensors(e.second, out);
  }
}
template <class K, class V, class... R>
void collect_tensors(const std::unordered_map<K, V, R...>& v, std::vector<at::Tensor>& out) {
  for (const auto& e : v) {
    collect_tensors(e.second, out);
  }
}
}  // namespace detail

/// Data parallelism over a c10d process group (Gloo for CPU tensors, NCCL for
/// CUDA tensors), one model replica per process. Not copyable; movable.
class DistributedDataParallel {
 public:
  /// Wraps `module` (any `torch::nn::Module`; its parameters that require
  /// gradients, in Python's order) for training over `group`. Collective:
  /// every rank checks that all hold parameters of the same shapes and
  /// dtypes, then takes rank 0's parameters and (with `broadcast_buffers`)
  /// buffers. Throws `c10::ValueError` for a null module or group or a
  /// `bucket_cap_mb` that is not positive, `c10::Error` where the module has
  /// no parameter that requires a gradient or the ranks' parameters differ.
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          c10::intrusive_ptr<c10d::ProcessGroup> group,
                          DistributedDataParallelOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(DistributedDataParallel&&) noexcept;
  DistributedDataParallel& operator=(DistributedDataParallel&&) noexcept;

  /// Python's `ddp(input)`: runs `call` (the module's own forward) between
  /// what Python's DDP does before it (buffers broadcast from rank 0, bucket
  /// rebuild after the first iteration) and after it (`prepare_for_backward`,
  /// with `call`'s tensors when `find_unused_parameters`), and returns what
  /// `call` returned. The backward that follows reduces the gradients, unless
  /// the forward ran under `no_sync()` or with gradients disabled. Parameters
  /// loaded since construction (`torch::load`, `Module::load`: every rank
  /// alike) are hooked again first (docs/distributed.md). Throws
  /// `c10::Error` where the previous iteration's reduction did not finish
  /// (a parameter got no gradient without `find_unused_parameters`). A
  /// failed all-reduce makes that backward throw `c10::Error` naming it.
  /// `ddp.forward(x)` (Python's habit) is a compile error that says so.
  template <class Call>
  auto forward(Call&& call) {
    static_assert(std::is_invocable_v<Call&>,
                  "torchamp::DistributedDataParallel::forward takes a callable that runs the "
                  "module's forward, not its inputs: ddp.forward([&] { return "
                  "model->forward(x); })");
    if constexpr (std::is_invocable_v<Call&>) {
      using Out = std::invoke_result_t<Call&>;
      static_assert(!std::is_void_v<Out>, "forward's callable must return the module's outputs");
      pre_forward_();
      Out out = call();
      std::vector<at::Tensor> tensors;
      if (wants_outputs_()) {
        detail::collect_tensors(out, tensors);
      }
      post_forward_(tensors);
      return out;
    }
  }

  /// While the returned guard lives, forwards (and their backwards) do not
  /// reduce: gradients accumulate locally, and the first forward and
  /// backward after it reduce the sum (Python's `with ddp.no_sync():`).
  class NoSync {
   public:
    NoSync(NoSync&& other) noexcept;
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync();

   private:
    friend class DistributedDataParallel;
    NoSync(bool* flag, bool previous) : flag_(flag), previous_(previous) {}
    bool* flag_;  // in the DDP's state, which a move of the DDP does not move
    bool previous_;
  };
  /// `no_sync(false)` changes nothing, for accumulation in one line:
  /// `auto guard = ddp.no_sync(micro + 1 < micro_batches);` (all but the last).
  [[nodiscard]] NoSync no_sync(bool enabled = true);

  /// Python's `require_backward_grad_sync`: false under `no_sync()`.
  bool require_backward_grad_sync() const;
  const std::shared_ptr<torch::nn::Module>& module() const;
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const;
  const DistributedDataParallelOptions& options() const;
  /// The parameters the Reducer reduces, in Python's order (the module's,
  /// depth first, each once, those that require a gradient).
  const std::vector<at::Tensor>& parameters() const;
  /// The buckets as indices into `parameters()`, in the order they are
  /// reduced (Python: the parameters of `ddp.reducer._get_zeros_like_grad_buckets()`):
  /// those the next backward reduces in, so after the first backward the
  /// ones the next forward's rebuild will make (Python still shows the old).
  std::vector<std::vector<size_t>> bucket_indices() const;
  /// Reduces in these buckets from the next forward on: what
  /// `bucket_indices()` returned in the run a checkpoint was saved from, so
  /// that the resumed run adds every gradient in the order the uninterrupted
  /// one does (on more than two ranks a sum's last bits depend on it; a new
  /// DDP's first iteration otherwise reduces in one bucket); from the next
  /// forward on. Collective: every rank calls it, between iterations, and
  /// every rank takes rank 0's buckets. No Python equivalent. Throws
  /// `c10::ValueError` naming the index or bucket where the buckets are not
  /// each parameter once, or a bucket is empty, mixes dtypes or devices, or
  /// shares a sparse parameter; nothing changed. The next forward throws
  /// the same where a parameter's dtype or device has changed since.
  void set_bucket_indices(std::vector<std::vector<size_t>> buckets);

 private:
  void pre_forward_();
  bool wants_outputs_() const;
  void post_forward_(const std::vector<at::Tensor>& outputs);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torchamp
