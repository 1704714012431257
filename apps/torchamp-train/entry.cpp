// torchamp-train's executable. Standalone it is one process; under torchrun
// (WORLD_SIZE > 1) the ranks meet at a c10d TCPStore and form a C++ Gloo
// process group, where this LibTorch has Gloo's headers (Debian's does; the
// pip wheels ship none: there, torchamp-train-py forms the group in Python).

#include "parallel.h"

#if TORCHAMP_TRAIN_CPP_GLOO
#include <torchamp/gloo.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>
#include <stdexcept>
#endif

namespace {

#if TORCHAMP_TRAIN_CPP_GLOO
// env:// rendezvous as Python's torch.distributed does it, with one
// difference: under torchrun the agent already serves a store at MASTER_PORT,
// and its protocol is the launcher's torch's (a 2.x launcher's store does not
// answer LibTorch 1.13's client), so rank 0 then serves this run's own store
// at MASTER_PORT + 1 (TORCHAMP_TRAIN_STORE_PORT overrides).
torchamp_train::Parallel make_gloo_group(const torchamp_train::LaunchEnv& env,
                                         const std::string& mode,
                                         std::chrono::milliseconds timeout) {
  int port = env.agent_store ? env.master_port + 1 : env.master_port;
  if (const char* p = std::getenv("TORCHAMP_TRAIN_STORE_PORT"); p != nullptr && *p != '\0') {
    port = std::atoi(p);
  }
  if (port < 1 || port > 65535) {
    throw std::invalid_argument(
        "the store's port " + std::to_string(port) +
        " is not in [1, 65535] (MASTER_PORT, or TORCHAMP_TRAIN_STORE_PORT)");
  }
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = env.rank == 0;
  options.numWorkers = env.world;
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    store = c10::make_intrusive<c10d::PrefixStore>(
        "torchamp-train", torchamp::make_tcp_store(env.master_addr, options));
    auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    gloo->devices.push_back(ifname != nullptr && *ifname != '\0'
                                ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                : c10d::ProcessGroupGloo::createDefaultDevice());
    group = torchamp::make_gloo_process_group(store, env.rank, env.world, gloo);
  } catch (const c10::Error& e) {
    throw std::runtime_error("rank " + std::to_string(env.rank) + " of " +
                             std::to_string(env.world) + ": cannot form the Gloo group at " +
                             env.master_addr + ":" + std::to_string(options.port) + ": " +
                             e.what_without_backtrace());
  }
  return torchamp_train::Parallel(group, mode, timeout);
}
#endif

}  // namespace

int main(int argc, char** argv) {
#if TORCHAMP_TRAIN_CPP_GLOO
  return torchamp_train::run(argc, argv, make_gloo_group);
#else
  return torchamp_train::run(argc, argv, nullptr);
#endif
}
