// The process group of a build with torchamp's process groups
// (no_process_group.cpp is the stand-in where there are none).

#include "launch.h"

#include <torchamp/process_group.h>

#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>

namespace torchamp_apps {

bool have_process_groups() {
  return true;
}

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
}  // namespace torchamp_apps
