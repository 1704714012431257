#include "parallel.h"

#if TORCHAMP_WITH_DISTRIBUTED
#include <torchamp/distributed.h>
#endif

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace torchamp_train {
std::vector<int> partition(const std::vector<int64_t>& sizes, int world) {
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> owner;
  owner.reserve(sizes.size());
  for (const int64_t n : sizes) {
    const auto r = std::min_element(load.begin(), load.end()) - load.begin();
    load[static_cast<size_t>(r)] += n;
    owner.push_back(static_cast<int>(r));
  }
  return owner;
}

#if TORCHAMP_WITH_DISTRIBUTED

struct Parallel::Impl {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

namespace {

// What a failed collective says, without LibTorch's backtrace.
std::string cause(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) {
    return c->what_without_backtrace();
  }
  return e.what();
}

// Runs `run` (collectives started and waited for, each at most the
// timeout); a failure (a rank died, the group timed out) becomes one error
// naming this rank and the collective.
template <class Run>
void guarded(const Parallel& p, const char* what, Run run) {
  try {
    run();
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(p.rank()) + " of " +
                             std::to_string(p.world()) + ": the " + what +
                             " over the process group failed (another rank died, or did not "
                             "arrive within " +
                             std::to_string(p.timeout().count() / 1000) + " s): " + cause(e));
  }
}

// One collective, waited for.
template <class Start>
void collective(const Parallel& p, const char* what, Start start) {
  guarded(p, what, [&] { start()->wait(p.timeout()); });
}

// Splits `index` (positions into `tensors`) into runs of one dtype and at
// most kBucketElements elements; each run is one flat bucket.
std::vector<std::vector<size_t>> buckets(const std::vector<at::Tensor>& tensors,
                                         const std::vector<size_t>& index) {
  std::vector<std::vector<size_t>> out;
  int64_t filled = Parallel::kBucketElements;
  for (const size_t i : index) {
    const int64_t n = tensors[i].numel();
    const bool other_type =
        !out.empty() && tensors[i].scalar_type() != tensors[out.back().front()].scalar_type();
    if ((filled + n > Parallel::kBucketElements && filled > 0) || other_type) {
      out.emplace_back();
      filled = 0;
    }
    out.back().push_back(i);
    filled += n;
  }
  return out;
}

at::Tensor flatten(const std::vector<at::Tensor>& tensors, const std::vector<size_t>& bucket) {
  std::vector<at::Tensor> flat;
  flat.reserve(bucket.size());
  for (const size_t i : bucket) {
    flat.push_back(tensors[i].reshape({-1}));
  }
  return at::cat(flat);
}

void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& tensors,
               const std::vector<size_t>& bucket) {
  int64_t offset = 0;
  for (const size_t i : bucket) {
    const at::Tensor& t = tensors[i];
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

std::vector<size_t> owned_by(const std::vector<int>& owner, int rank) {
  std::vector<size_t> index;
  for (size_t i = 0; i < owner.size(); ++i) {
    if (owner[i] == rank) {
      index.push_back(i);
    }
  }
  return index;
}

// One collective rooted at each owner per bucket of its tensors; the result
// is kept by the owner (`into_owner`: a reduce) or by the others (a broadcast).
template <class Start>
void per_owner(const Parallel& p, const std::vector<at::Tensor>& tensors,
               const std::vector<int>& owner, const char* what, bool into_owner, Start start) {
  if (!p.distributed()) {
    return;
  }
  for (int r = 0; r < p.world(); ++r) {
    for (const auto& bucket : buckets(tensors, owned_by(owner, r))) {
      std::vector<at::Tensor> flat = {flatten(tensors, bucket)};
      collective(p, what, [&] { return start(flat, r); });
      if ((r == p.rank()) == into_owner) {
        unflatten(flat.front(), tensors, bucket);
      }
    }
  }
}

}  // namespace

Parallel::Parallel(c10::intrusive_ptr<c10d::ProcessGroup> group, std::string mode,
                   std::chrono::milliseconds timeout)
    : impl_(std::make_shared<Impl>(Impl{group})),
      rank_(group->getRank()),
      world_(group->getSize()),
      mode_(std::move(mode)),
      timeout_(timeout) {
  TORCH_CHECK_VALUE(mode_ == "data" || mode_ == "sharded", "--parallel: unknown mode '", mode_,
                    "' (data or sharded)");
}

const c10::intrusive_ptr<c10d::ProcessGroup>& Parallel::group() const {
  return impl_->group;
}

void Parallel::all_reduce_sum(const std::vector<at::Tensor>& tensors) const {
  if (!distributed()) {
    return;
  }
  std::vector<size_t> all(tensors.size());
  for (size_t i = 0; i < all.size(); ++i) {
    all[i] = i;
  }
  const auto bs = buckets(tensors, all);
  std::vector<std::vector<at::Tensor>> flat;
  for (const auto& bucket : bs) {
    flat.push_back({flatten(tensors, bucket)});
  }
  // Every bucket's all-reduce in flight at once, then all waited for.
  guarded(*this, "all-reduce", [&] {
    std::vector<decltype(impl_->group->allreduce(flat.front()))> works;
    for (auto& f : flat) {
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;
      opts.timeout = timeout_;
      works.push_back(impl_->group->allreduce(f, opts));
    }
    for (auto& w : works) {
      w->wait(timeout_);
    }
  });
  for (size_t b = 0; b < bs.size(); ++b) {
    unflatten(flat[b].front(), tensors, bs[b]);
  }
}

void Parallel::reduce_to_owners(const std::vector<at::Tensor>& tensors,
                                const std::vector<int>& owner) const {
  per_owner(*this, tensors, owner, "gradient reduce", true,
            [&](std::vector<at::Tensor>& flat, int root) {
              c10d::ReduceOptions opts;
              opts.reduceOp = c10d::ReduceOp::SUM;
              opts.rootRank = root;
              opts.timeout = timeout_;
              return impl_->group->reduce(flat, opts);
            });
}

void Parallel::broadcast_from_owners(const std::vector<at::Tensor>& tensors,
                                     const std::vector<int>& owner) const {
  per_owner(*this, tensors, owner, "parameter broadcast", false,
            [&](std::vector<at::Tensor>& flat, int root) {
              c10d::BroadcastOptions opts;
              opts.rootRank = root;
              opts.timeout = timeout_;
              return impl_->group->broadcast(flat, opts);
            });
}

void Parallel::guard(const char* what, const std::function<void()>& run) const {
  if (!distributed()) {
    run();
    return;
  }
  guarded(*this, what, run);
}

std::vector<int64_t> Parallel::all_gather(int64_t value) const {
  if (!distributed()) {
    return {value};
  }
  // A sum of one-hot slots: every collective backend has all-reduce.
  std::vector<at::Tensor> slots = {at::zeros({world_}, at::kLong)};
  slots.front()[rank_] = value;
  collective(*this, "all-gather", [&] {
    c10d::AllreduceOptions opts;
    opts.timeout = timeout_;
    return impl_->group->allreduce(slots, opts);
  });
  const at::Tensor s = slots.front();
  return std::vector<int64_t>(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + world_);
}

std::vector<std::string> Parallel::gather_to_root(const std::string& bytes) const {
  if (!distributed()) {
    return {bytes};
  }
  const std::vector<int64_t> sizes = all_gather(static_cast<int64_t>(bytes.size()));
  std::vector<std::string> out;
  if (rank_ == 0) {
    out.push_back(bytes);
  }
  for (int r = 1; r < world_; ++r) {
    std::vector<at::Tensor> buf = {at::empty({sizes[static_cast<size_t>(r)]}, at::kByte)};
    if (r == rank_) {
      std::memcpy(buf.front().data_ptr(), bytes.data(), bytes.size());
    }
    collective(*this, "checkpoint gather", [&] {
      c10d::BroadcastOptions opts;
      opts.rootRank = r;
      opts.timeout = timeout_;
      return impl_->group->broadcast(buf, opts);
    });
    if (rank_ == 0) {
      out.emplace_back(static_cast<const char*>(buf.front().data_ptr()),
                       static_cast<size_t>(sizes[static_cast<size_t>(r)]));
    }
  }
  return out;
}

Parallel form_parallel(const torchamp_apps::LaunchEnv& env, const std::string& mode,
                       std::chrono::milliseconds timeout) {
  return Parallel(torchamp_apps::form_group(env, timeout), mode, timeout);
}

std::function<bool(bool, c10::Device)> Parallel::found_inf_agreement() const {
  return distributed() ? torchamp::all_reduce_found_inf(impl_->group, timeout_)
                       : std::function<bool(bool, c10::Device)>();
}

#else  // a build without process groups: one process only

Parallel form_parallel(const torchamp_apps::LaunchEnv& env, const std::string&,
                       std::chrono::milliseconds timeout) {
  torchamp_apps::form_group(env, timeout);  // throws on more than one process
  return Parallel();
}

std::function<bool(bool, c10::Device)> Parallel::found_inf_agreement() const {
  return {};
}

void Parallel::guard(const char*, const std::function<void()>& run) const {
  run();
}

void Parallel::all_reduce_sum(const std::vector<at::Tensor>&) const {}
void Parallel::reduce_to_owners(const std::vector<at::Tensor>&, const std::vector<int>&) const {}
void Parallel::broadcast_from_owners(const std::vector<at::Tensor>&,
                                     const std::vector<int>&) const {}
std::vector<int64_t> Parallel::all_gather(int64_t value) const {
  return {value};
}
std::vector<std::string> Parallel::gather_to_root(const std::string& bytes) const {
  return {bytes};
}

#endif

}  // namespace torchamp_train
