// One rank of a distributed scaler test over a C++ Gloo process group
// (c10d::FileStore + ProcessGroupGloo over loopback); the scenarios are in
// dist_scenarios.h.
//
//   dist_worker SCENARIO RANK WORLD STORE_FILE OUT_FILE
#include "dist_scenarios.h"

#include <torchamp/gloo.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: dist_worker SCENARIO RANK WORLD STORE_FILE OUT_FILE\n";
    return 2;
  }
  const int rank = std::atoi(argv[2]);
  const int world = std::atoi(argv[3]);
  const std::string store_file = argv[4];
  auto make_group = [&]() -> c10::intrusive_ptr<c10d::ProcessGroup> {
    auto store = c10::make_intrusive<c10d::FileStore>(store_file, world);
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(5000));
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    return torchamp::make_gloo_process_group(store, rank, world, options);
  };
  return torchamp_dist::run_scenario(argv[1], rank, world, make_group, argv[5]);
}
