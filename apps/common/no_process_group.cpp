// The stand-in for process groups in a build without them
// (TORCHAMP_WITH_DISTRIBUTED=OFF): one process only.

#include "launch.h"

#include <stdexcept>
#include <string>

namespace torchamp_apps {

bool have_process_groups() {
  return false;
}

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

}  // namespace torchamp_apps
