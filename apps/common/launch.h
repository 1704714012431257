#pragma once

// Where this process stands, its process group and its model's DDP: the one
// launch every app under apps/ uses. CMake builds process_group.cpp where
// torchamp has process groups and no_process_group.cpp where it has none
// (TORCHAMP_WITH_DISTRIBUTED=OFF): the apps' code has no #if for it.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace torchamp_apps {

/// What torchrun (or whoever starts the processes) says about this one:
/// RANK, WORLD_SIZE, LOCAL_RANK (where the ranks meet is
/// torchamp::init_process_group's business).
struct LaunchEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  /// Reads the variables; throws std::invalid_argument naming a malformed
  /// one. Without WORLD_SIZE: one process.
  static LaunchEnv from_environment();
};

/// The Gloo group of a run on `env.world` > 1 processes, formed as Python's
/// dist.init_process_group("gloo") is (torchamp::init_process_group), each
/// collective at most `timeout`; null on one process. Throws
/// std::invalid_argument for a bad launch environment or a build without
/// process groups, std::runtime_error naming the rank when the group cannot
/// form.
c10::intrusive_ptr<c10d::ProcessGroup> form_group(const LaunchEnv& env,
                                                  std::chrono::milliseconds timeout);

/// A model's gradients summed over the group during backward
/// (torchamp::DistributedDataParallel, summed rather than averaged: each
/// rank weights its own loss), or nothing on one process and in a build
/// without process groups.
class DataParallel {
 public:
  DataParallel();
  /// Null `group`: one process, every call passes through.
  DataParallel(std::shared_ptr<torch::nn::Module> model,
               c10::intrusive_ptr<c10d::ProcessGroup> group);
  ~DataParallel();
  DataParallel(DataParallel&&) noexcept;
  DataParallel& operator=(DataParallel&&) noexcept;

  /// `forward()` under DDP while the model trains (its hooks arm the
  /// reduction), else as it is.
  at::Tensor forward(const std::function<at::Tensor()>& forward, bool training);
  /// While the returned guard lives, backward's gradients stay local (DDP's
  /// no_sync) when `local`; an empty guard otherwise.
  std::shared_ptr<void> no_sync(bool local);
  /// `local` summed over the group.
  double sum(double local);
  /// The DDP's buckets (DistributedDataParallel::bucket_indices()), for a
  /// checkpoint; none on one process.
  std::vector<std::vector<int64_t>> buckets() const;
  /// A checkpoint's buckets, so a resumed run reduces as the uninterrupted
  /// one (DistributedDataParallel::set_bucket_indices: a collective, so
  /// every rank calls it, as every rank loads); nothing on one process.
  void set_buckets(const std::vector<std::vector<int64_t>>& buckets);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace torchamp_apps
