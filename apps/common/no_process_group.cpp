// The stand-in for process groups in a build without them
// (TORCHAMP_WITH_DISTRIBUTED=OFF): one process only.

#include "launch.h"

#include <memory>
#include <stdexcept>
#include <string>

namespace torchamp_apps {

c10::intrusive_ptr<c10d::ProcessGroup> form_group(const LaunchEnv& env,
                                                  std::chrono::milliseconds /*timeout*/) {
  if (env.world <= 1) {
    return {};
  }
  throw std::invalid_argument("WORLD_SIZE=" + std::to_string(env.world) +
                              " but this program was built without distributed support "
                              "(TORCHAMP_WITH_DISTRIBUTED=OFF), so it cannot form a process "
                              "group");
}

struct DataParallel::Impl {};

DataParallel::DataParallel() : impl_(std::make_unique<Impl>()) {}

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> /*model*/,
                           c10::intrusive_ptr<c10d::ProcessGroup> group)
    : impl_(std::make_unique<Impl>()) {
  if (group) {
    throw std::invalid_argument("a process group in a build without process groups");
  }
}

DataParallel::~DataParallel() = default;
DataParallel::DataParallel(DataParallel&&) noexcept = default;
DataParallel& DataParallel::operator=(DataParallel&&) noexcept = default;

at::Tensor DataParallel::forward(const std::function<at::Tensor()>& forward, bool /*training*/) {
  return forward();
}

std::shared_ptr<void> DataParallel::no_sync(bool /*local*/) {
  return {};
}

double DataParallel::sum(double local) {
  return local;
}

std::vector<std::vector<int64_t>> DataParallel::buckets() const {
  return {};
}

void DataParallel::set_buckets(const std::vector<std::vector<int64_t>>& /*buckets*/) {}

}  // namespace torchamp_apps
