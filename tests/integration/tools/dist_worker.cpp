// One rank of a distributed scaler test over a Gloo process group that
// torchamp::init_process_group forms (file:// rendezvous, loopback); the
// scenarios are in dist_scenarios.h.
//
//   dist_worker SCENARIO RANK WORLD STORE_FILE OUT_FILE
#include "dist_scenarios.h"

#include <torchamp/process_group.h>

#include <cstdlib>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: dist_worker SCENARIO RANK WORLD STORE_FILE OUT_FILE\n";
    return 2;
  }
  const int rank = std::atoi(argv[2]);
  const int world = std::atoi(argv[3]);
  const std::string store_file = argv[4];
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 0);
  auto make_group = [&]() {
    return torchamp::init_process_group(torchamp::ProcessGroupOptions()
                                            .backend("gloo")
                                            .init_method("file://" + store_file)
                                            .rank(rank)
                                            .world_size(world)
                                            .timeout(std::chrono::milliseconds(5000)));
  };
  return torchamp_dist::run_scenario(argv[1], rank, world, make_group, argv[5]);
}
