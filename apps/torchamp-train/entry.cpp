// torchamp-train's executable. Standalone it is one process; under torchrun
// (WORLD_SIZE > 1) the ranks form their process group as Python's
// dist.init_process_group("gloo") does: torchamp::init_process_group.

#include "parallel.h"

#include <torchamp/config.h>
#if TORCHAMP_WITH_DISTRIBUTED
#include <torchamp/process_group.h>

#include <c10/util/Exception.h>

#include <stdexcept>
#endif

namespace {

#if TORCHAMP_WITH_DISTRIBUTED
torchamp_train::Parallel make_group(const torchamp_train::LaunchEnv& env, const std::string& mode,
                                    std::chrono::milliseconds timeout) {
  try {
    auto group = torchamp::init_process_group(
        torchamp::ProcessGroupOptions().backend("gloo").timeout(timeout));
    return torchamp_train::Parallel(group, mode, timeout);
  } catch (const c10::ValueError& e) {  // the launch environment: exit 2
    throw std::invalid_argument(e.what_without_backtrace());
  } catch (const c10::Error& e) {
    throw std::runtime_error("rank " + std::to_string(env.rank) + " of " +
                             std::to_string(env.world) +
                             ": cannot form the Gloo group: " + e.what_without_backtrace());
  }
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if TORCHAMP_WITH_DISTRIBUTED
  return torchamp_train::run(argc, argv, make_group);
#else
  return torchamp_train::run(argc, argv, nullptr);
#endif
}
