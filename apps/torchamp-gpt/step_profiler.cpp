#include "step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>
#include <stdexcept>

namespace torchamp_gpt {

namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

}  // namespace

StepProfiler::StepProfiler(bool cuda) {
  if (prof::profilerEnabled()) {
    throw std::logic_error("--profile: LibTorch's profiler is already on in this process");
  }
  // As torch.profiler.profile starts it: prepared (Kineto's set-up, kept out
  // of the trace), then enabled for every scope (the "step" marks are user
  // scopes).
  const ProfilerConfig config(ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) {
    activities.insert(ActivityType::CUDA);
  }
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  on_ = true;
}

StepProfiler::~StepProfiler() {
  if (on_) {
    try {
      prof::disableProfiler();
    } catch (...) {  // a destructor on an error's path: the error that got here counts
    }
  }
}

void StepProfiler::save(const std::string& path) {
  on_ = false;
  prof::disableProfiler()->save(path);
}

}  // namespace torchamp_gpt
