// Where this process stands: torchrun's variables.

#include "launch.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace torchamp_apps {

namespace {

int env_int(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    return fallback;
  }
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < lo || n > hi) {
    throw std::invalid_argument(std::string(name) + "=" + v + " is not an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return static_cast<int>(n);
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv e;
  e.world = env_int("WORLD_SIZE", 1, 1, 1 << 20);
  e.rank = env_int("RANK", 0, 0, e.world - 1);
  e.local_rank = env_int("LOCAL_RANK", e.rank, 0, 1 << 20);
  return e;
}

}  // namespace torchamp_apps
