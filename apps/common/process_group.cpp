// The process group of a build with torchamp's process groups
// (no_process_group.cpp is the stand-in where there are none).

#include "launch.h"

#include <torchamp/data_parallel.h>
#include <torchamp/process_group.h>

#include <ATen/ops/tensor.h>

#include <c10/util/Exception.h>

#include <optional>
#include <stdexcept>
#include <string>

namespace torchamp_apps {

c10::intrusive_ptr<c10d::ProcessGroup> form_group(const LaunchEnv& env,
                                                  std::chrono::milliseconds timeout) {
  if (env.world <= 1) {
    return {};
  }
  try {
    return torchamp::init_process_group(
        torchamp::ProcessGroupOptions().backend("gloo").timeout(timeout));
  } catch (const c10::ValueError& e) {  // the launch environment
    throw std::invalid_argument(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    throw std::runtime_error("rank " + std::to_string(env.rank) + " of " +
                             std::to_string(env.world) +
                             ": cannot form the Gloo group: " + e.what_without_backtrace());
  }
}
struct DataParallel::Impl {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  std::optional<torchamp::DistributedDataParallel> ddp;
};

DataParallel::DataParallel() : impl_(std::make_unique<Impl>()) {}

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> model,
                           c10::intrusive_ptr<c10d::ProcessGroup> group)
    : impl_(std::make_unique<Impl>()) {
  if (group) {
    impl_->group = group;
    impl_->ddp.emplace(std::move(model), std::move(group),
                       torchamp::DistributedDataParallelOptions().average_gradients(false));
  }
}

DataParallel::~DataParallel() = default;
DataParallel::DataParallel(DataParallel&&) noexcept = default;
DataParallel& DataParallel::operator=(DataParallel&&) noexcept = default;

at::Tensor DataParallel::forward(const std::function<at::Tensor()>& forward, bool training) {
  return impl_->ddp && training ? impl_->ddp->forward(forward) : forward();
}

std::shared_ptr<void> DataParallel::no_sync(bool local) {
  if (!impl_->ddp || !local) {
    return {};
  }
  return std::make_shared<torchamp::DistributedDataParallel::NoSync>(impl_->ddp->no_sync());
}

double DataParallel::sum(double local) {
  if (!impl_->group) {
    return local;
  }
  std::vector<at::Tensor> v{at::tensor({local}, at::kDouble)};
  impl_->group->allreduce(v)->wait();
  return v[0].item<double>();
}

std::vector<std::vector<int64_t>> DataParallel::buckets() const {
  std::vector<std::vector<int64_t>> out;
  if (impl_->ddp) {
    for (const auto& b : impl_->ddp->bucket_indices()) {
      out.emplace_back(b.begin(), b.end());
    }
  }
  return out;
}

void DataParallel::set_buckets(const std::vector<std::vector<int64_t>>& buckets) {
  if (!impl_->ddp) {
    return;
  }
  std::vector<std::vector<size_t>> indices;
  for (const auto& b : buckets) {
    indices.emplace_back();
    for (const int64_t i : b) {
      TORCH_CHECK_VALUE(i >= 0, "a checkpoint's DDP bucket holds the index ", i);
      indices.back().push_back(static_cast<size_t>(i));
    }
  }
  impl_->ddp->set_bucket_indices(std::move(indices));
}

}  // namespace torchamp_apps
