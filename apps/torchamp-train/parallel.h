#pragma once

// torchamp-train on more than one process: where this process stands (from
// torchrun's environment) and the collectives a training step needs over a
// c10d process group. Each rank's loss is weighted by its slice's share of
// the global batch, and the ranks' gradients are summed:
//
//   data     every rank takes its slice of each global batch;
//            torchamp::DistributedDataParallel (c10d's Reducer) sums the
//            still scaled gradients during backward; every rank then holds
//            the same gradients and steps the whole model, so the scaler
//            decides the same everywhere alone.
//   sharded  ZeRO-1, by hand: each parameter belongs to one rank, which
//            alone keeps its optimizer state and steps it. Gradients are
//            summed into their owner (a reduce per owner's bucket), so a rank
//            sees only its shard's gradients; torchamp::set_process_group
//            makes the scaler agree on found-inf over the group, and the
//            owners then broadcast the stepped parameters.

#include "launch.h"

#include <torchamp/config.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#if TORCHAMP_WITH_DISTRIBUTED
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torchamp_train {

/// One process, or one rank of a c10d process group with its mode ("data"
/// or "sharded") and the time any collective may take.
class Parallel {
 public:
  Parallel() = default;  // one process: every collective is a no-op
#if TORCHAMP_WITH_DISTRIBUTED
  Parallel(c10::intrusive_ptr<c10d::ProcessGroup> group, std::string mode,
           std::chrono::milliseconds timeout);
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const;
#endif

  int rank() const {
    return rank_;
  }
  int world() const {
    return world_;
  }
  bool distributed() const {
    return world_ > 1;
  }
  bool sharded() const {
    return distributed() && mode_ == "sharded";
  }
  const std::string& mode() const {
    return mode_;
  }
  std::chrono::milliseconds timeout() const {
    return timeout_;
  }

  /// Sums the tensors over the ranks, in place, as flat buckets (each of one
  /// dtype, at most kBucketElements), all in flight together.
  void all_reduce_sum(const std::vector<at::Tensor>& tensors) const;
  /// Sums tensor i over the ranks into its owner `owner[i]` (one reduce per
  /// owner's bucket); on the other ranks it keeps its local value.
  void reduce_to_owners(const std::vector<at::Tensor>& tensors,
                        const std::vector<int>& owner) const;
  /// Copies tensor i from rank `owner[i]` to every rank.
  void broadcast_from_owners(const std::vector<at::Tensor>& tensors,
                             const std::vector<int>& owner) const;
  /// Runs `run` (a step with collectives in it: a backward under
  /// DistributedDataParallel); a failure becomes the error every collective
  /// here throws, naming this rank, `what` and the timeout.
  void guard(const char* what, const std::function<void()>& run) const;
  /// The scaler's agreement on overflow over the group
  /// (torchamp::all_reduce_found_inf, each call at most the timeout): a
  /// GradScaler::FoundInfReducer. Null on one process.
  std::function<bool(bool found_inf, c10::Device device)> found_inf_agreement() const;
  /// Every rank's `value`, on every rank.
  std::vector<int64_t> all_gather(int64_t value) const;
  /// Every rank's `bytes`, on rank 0 (empty elsewhere).
  std::vector<std::string> gather_to_root(const std::string& bytes) const;

  static constexpr int64_t kBucketElements = 1 << 20;  // 4 MB of float32

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
  int rank_ = 0;
  int world_ = 1;
  std::string mode_ = "none";
  std::chrono::milliseconds timeout_{0};
};

/// The owner of each of `sizes` (numbers of elements) among `world` ranks:
/// in order, each to the least loaded rank so far (the lowest on a tie).
std::vector<int> partition(const std::vector<int64_t>& sizes, int world);

/// The process group of a run on `env.world` > 1 processes
/// (torchamp_apps::form_group) in `mode` ("data" or "sharded"); throws as
/// form_group does (std::invalid_argument in a build without process groups).
Parallel form_parallel(const torchamp_apps::LaunchEnv& env, const std::string& mode,
                       std::chrono::milliseconds timeout);

}  // namespace torchamp_train
