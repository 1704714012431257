// torchamp::init_process_group and new_group in this process: bad input is a
// typed error that names what is wrong and changes nothing, a peer that never
// arrives is an error within the timeout, and a one-rank group works.
// (Several ranks: the new-group scenario in test_distributed.cpp, and the
// tests that run torchrun.)

#include <torchamp/process_group.h>

#include <ATen/Context.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <gtest/gtest.h>

#include "distributed/device_backends.h"
#include "test_util.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using torchamp::ProcessGroupOptions;
using torchamp_test::expect_throws;

// Sets the launch variables for one test and puts back what was there.
using Vars = std::map<std::string, std::optional<std::string>>;
class Env {
 public:
  explicit Env(const Vars& vars) {
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
      set(name, value);
    }
  }
  ~Env() {
    for (const auto& [name, value] : saved_) {
      set(name, value);
    }
  }

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

// A port nobody listens on now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// init_process_group(options) throws a c10::ValueError containing `needle`
// and leaves no group formed.
void expect_value_error(const ProcessGroupOptions& options, const std::string& needle) {
  expect_throws<c10::ValueError>([&] { torchamp::init_process_group(options); }, needle);
  EXPECT_FALSE(torchamp::is_initialized()) << needle;
}

const Vars kTorchrun = {{"RANK", "0"},
                        {"WORLD_SIZE", "1"},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "29500"},
                        {"TORCHELASTIC_USE_AGENT_STORE", std::nullopt}};

Vars torchrun_but(const std::string& name, std::optional<std::string> value) {
  auto vars = kTorchrun;
  vars[name] = std::move(value);
  return vars;
}

TEST(ProcessGroup, AMissingEmptyOrGarbledVariableIsAValueErrorNamingIt) {
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    for (const std::optional<std::string>& value : {std::optional<std::string>(), {""}}) {
      Env env(torchrun_but(name, value));
      expect_value_error({},
                         std::string("environment variable ") + name + " expected, but not set");
    }
  }
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_PORT"}) {
    Env env(torchrun_but(name, "1x"));
    expect_value_error({},
                       std::string("environment variable ") + name + " is '1x', not an integer");
  }
  Env env(torchrun_but("MASTER_PORT", "70000"));
  expect_value_error({}, "port must have value from 0 to 65535 but was 70000");
}

TEST(ProcessGroup, ARankOutsideTheWorldIsAValueError) {
  Env env(torchrun_but("RANK", "2"));
  expect_value_error({}, "rank 2 is not in [0, world_size) for world_size 1");
  expect_value_error(
      ProcessGroupOptions().rank(-3).world_size(2).init_method("tcp://127.0.0.1:29500"),
      "rank -3 is not in [0, world_size) for world_size 2");
  expect_value_error(ProcessGroupOptions().init_method("file:///tmp/x?rank=0&world_size=0"),
                     "world_size is 0, not at least 1");
}

TEST(ProcessGroup, AnUnknownBackendOrInitMethodIsAValueError) {
  Env env(kTorchrun);
  expect_value_error(ProcessGroupOptions().backend("mpi"), "unknown backend 'mpi'");
  expect_value_error(ProcessGroupOptions().backend("cpu:gloo,tpu:gloo"), "'tpu:gloo'");
  expect_value_error(ProcessGroupOptions().init_method("etcd://h:1"),
                     "No rendezvous handler for etcd://");
  expect_value_error(ProcessGroupOptions().init_method("localhost"), "is not a URL");
  expect_value_error(ProcessGroupOptions().init_method("tcp://127.0.0.1?rank=0&world_size=1"),
                     "tcp:// rendezvous: port number missing");
  expect_value_error(ProcessGroupOptions().init_method("file:///tmp/x?world_size=1"),
                     "file:// rendezvous: rank parameter missing");
  expect_value_error(ProcessGroupOptions().timeout(std::chrono::milliseconds(0)),
                     "timeout is 0 ms, not positive");
  const fs::path path =
      fs::path(::testing::TempDir()) / ("torchamp-pg-store-" + std::to_string(::getpid()));
  auto store = c10::make_intrusive<c10d::FileStore>(path.string(), 1);
  expect_value_error(ProcessGroupOptions().store(store).init_method("env://"),
                     "Cannot specify both init_method and store.");
  expect_value_error(ProcessGroupOptions().store(store), "rank (-1) and world_size (-1)");
  fs::remove(path);
}

TEST(ProcessGroup, APeerThatNeverArrivesIsAnErrorWithinTheTimeout) {
  Env env(kTorchrun);
  const auto timeout = std::chrono::milliseconds(1500);
  const int port = free_port();
  // Rank 0 of 2 serves and waits for rank 1; rank 1 of 2 finds no server.
  for (int rank : {0, 1}) {
    const auto start = std::chrono::steady_clock::now();
    expect_throws<c10::Error>(
        [&] {
          torchamp::init_process_group(ProcessGroupOptions()
                                           .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                           .rank(rank)
                                           .world_size(2)
                                           .timeout(timeout));
        },
        "rank " + std::to_string(rank) + " of 2 at 127.0.0.1:" + std::to_string(port) +
            ", timeout 1500 ms");
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_FALSE(torchamp::is_initialized());
    EXPECT_LT(took, timeout + std::chrono::seconds(5)) << "rank " << rank;
    if (rank == 0) {  // the server waits the whole timeout for its client
      EXPECT_GE(took, timeout - std::chrono::milliseconds(100));
    }
  }
}

TEST(ProcessGroup, OneRankFormsAGroupAndNewGroupsAndASecondInitChangesNothing) {
  const fs::path store =
      fs::path(::testing::TempDir()) / ("torchamp-pg-" + std::to_string(::getpid()));
  fs::remove(store);
  Env env(Vars{{"GLOO_SOCKET_IFNAME", "lo"}});
  auto options =
      ProcessGroupOptions().init_method("file://" + store.string()).rank(0).world_size(1);
  EXPECT_FALSE(torchamp::is_initialized());
  expect_throws<c10::ValueError>([] { torchamp::default_process_group(); },
                                 "has not been initialized");
  auto group = torchamp::init_process_group(options);
  ASSERT_TRUE(group);
  // The default backend: NCCL only where this build has it and a GPU is
  // present (a CUDA LibTorch on a machine without one forms Gloo's, as
  // Python does there).
  const std::string expected =
      torchamp::is_backend_available("nccl") && at::hasCUDA() ? "nccl" : "gloo";
  EXPECT_EQ(group->getBackendName(), expected);
  EXPECT_TRUE(torchamp::is_initialized());
  EXPECT_EQ(torchamp::default_process_group().get(), group.get());
  EXPECT_EQ(group->getRank(), 0);
  EXPECT_EQ(group->getSize(), 1);
  std::vector<at::Tensor> t = {at::full({3}, 2.0)};
  group->allreduce(t)->wait();
  EXPECT_EQ(t[0][0].item<double>(), 2.0);

  expect_throws<c10::ValueError>([&] { torchamp::init_process_group(options); },
                                 "initialize the default process group twice");
  EXPECT_EQ(torchamp::default_process_group().get(), group.get());

  auto all = torchamp::new_group();
  ASSERT_TRUE(all);
  EXPECT_EQ(all->getBackendName(), expected);
  all->allreduce(t)->wait();
  EXPECT_TRUE(torchamp::new_group(torchamp::NewGroupOptions().ranks({0})));
  expect_throws<c10::ValueError>(
      [] {
        torchamp::new_group(torchamp::NewGroupOptions().ranks({0, 1}));
      },
      "rank 1 in ranks is not in [0, 1)");
  expect_throws<c10::ValueError>(
      [] { torchamp::new_group(torchamp::NewGroupOptions().backend("foo")); },
      "unknown backend 'foo'");

  torchamp::destroy_process_group();
  EXPECT_FALSE(torchamp::is_initialized());
  fs::remove(store);
  auto again = torchamp::init_process_group(options);
  EXPECT_TRUE(again);
  torchamp::destroy_process_group();
  fs::remove(store);
}

// A dead peer's closed socket must fail the collective, not kill this
// process by SIGPIPE (exit 141, no message: what torchamp-train's survivors
// did, now and then, when a rank was killed). init_process_group ignores
// SIGPIPE as Python's interpreter does, where the program left the default;
// a program's own handler stays, and a failed call puts the default back.
TEST(ProcessGroup, SigpipeIsIgnoredWhereTheProgramLeftTheDefault) {
  const auto handler = [] {
    struct sigaction now {};
    ::sigaction(SIGPIPE, nullptr, &now);
    return now.sa_handler;
  };
  const auto set = [](void (*h)(int)) {
    struct sigaction to {};
    to.sa_handler = h;
    sigemptyset(&to.sa_mask);
    ::sigaction(SIGPIPE, &to, nullptr);
  };
  const fs::path store =
      fs::path(::testing::TempDir()) / ("torchamp-pg-sigpipe-" + std::to_string(::getpid()));
  fs::remove(store);
  Env env(Vars{{"GLOO_SOCKET_IFNAME", "lo"}});
  const auto options =
      ProcessGroupOptions().init_method("file://" + store.string()).rank(0).world_size(1);

  set(SIG_DFL);  // a failed call: the default stays
  expect_throws<c10::ValueError>(
      [&] { torchamp::init_process_group(ProcessGroupOptions(options).init_method("etcd://h:1")); },
      "No rendezvous handler for etcd://");
  EXPECT_EQ(handler(), SIG_DFL);

  torchamp::init_process_group(options);
  EXPECT_EQ(handler(), SIG_IGN);
  // Writing to a socket whose peer is gone now fails with EPIPE.
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  ::close(fds[1]);
  const char byte = 0;
  EXPECT_EQ(::write(fds[0], &byte, 1), -1);
  EXPECT_EQ(errno, EPIPE);
  ::close(fds[0]);
  torchamp::destroy_process_group();
  fs::remove(store);

  static void (*const own)(int) = [](int) {};
  set(own);  // the program's own handler is kept
  torchamp::init_process_group(options);
  EXPECT_EQ(handler(), own);
  torchamp::destroy_process_group();
  fs::remove(store);
  set(SIG_IGN);
}

TEST(ProcessGroup, ABadGlooSocketIfnameIsAValueErrorNamingIt) {
  const fs::path store =
      fs::path(::testing::TempDir()) / ("torchamp-pg-ifname-" + std::to_string(::getpid()));
  fs::remove(store);
  Env env(Vars{{"GLOO_SOCKET_IFNAME", "lo,nosuch0"}});
  expect_value_error(
      ProcessGroupOptions().init_method("file://" + store.string()).rank(0).world_size(1),
      "GLOO_SOCKET_IFNAME is 'lo,nosuch0': no Gloo device for interface 'nosuch0'");
  fs::remove(store);
}

using DeviceBackends = std::vector<std::pair<std::string, std::string>>;

// Python's BackendConfig for each kind of machine and build: NCCL for CUDA
// tensors only where the build has it and a GPU is present.
TEST(ProcessGroup, TheDefaultBackendIsNcclOnlyWhereAGpuIsPresent) {
  using torchamp::detail::device_backends;
  const DeviceBackends gloo = {{"cpu", "gloo"}, {"cuda", "gloo"}};
  EXPECT_EQ(device_backends("", true, false), gloo);  // pip's CUDA LibTorch, no GPU
  EXPECT_EQ(device_backends("", false, false), gloo);
  EXPECT_EQ(device_backends("", false, true), gloo);  // a GPU, but no NCCL built
  EXPECT_EQ(device_backends("", true, true), DeviceBackends({{"cpu", "gloo"}, {"cuda", "nccl"}}));
  EXPECT_EQ(device_backends("GLOO", true, false), gloo);
  EXPECT_EQ(device_backends("nccl", true, true), DeviceBackends({{"cuda", "nccl"}}));
  EXPECT_EQ(device_backends("cpu:gloo,cuda:nccl", true, true),
            DeviceBackends({{"cpu", "gloo"}, {"cuda", "nccl"}}));
  EXPECT_EQ(device_backends("cuda:gloo", true, false), DeviceBackends({{"cuda", "gloo"}}));
  // NCCL by name without a GPU: Python's ValueError, named.
  for (const std::string backend : {"nccl", "NCCL", "cpu:gloo,cuda:nccl"}) {
    expect_throws<c10::ValueError>([&] { device_backends(backend, true, false); },
                                   "backend '" + backend +
                                       "' asks for NCCL, which needs a CUDA "
                                       "device, and this machine has none");
  }
  expect_throws<c10::ValueError>([] { device_backends("ucc", true, true); },
                                 "unknown backend 'ucc'");
}

// On this machine: "nccl" by name is a typed error before any rendezvous
// where it cannot form (no NCCL in this build, or no GPU), and nothing is
// formed; the default forms a group (OneRankForms... above).
TEST(ProcessGroup, NcclByNameWhereItCannotFormIsATypedErrorAndChangesNothing) {
  if (torchamp::is_backend_available("nccl") && at::hasCUDA()) {
    GTEST_SKIP() << "a GPU is present and this build has NCCL";
  }
  Env env(kTorchrun);
  for (const std::string backend : {"nccl", "cpu:gloo,cuda:nccl"}) {
    const auto options = ProcessGroupOptions().backend(backend);
    if (torchamp::is_backend_available("nccl")) {
      expect_value_error(options, "which needs a CUDA device, and this machine has none");
    } else {
      expect_throws<c10::NotImplementedError>([&] { torchamp::init_process_group(options); },
                                              "this libtorchamp has no NCCL");
      EXPECT_FALSE(torchamp::is_initialized());
    }
  }
}

// Python's dist.is_torchelastic_launched(): torchrun sets TORCHELASTIC_RUN_ID.
TEST(ProcessGroup, IsTorchelasticLaunchedReadsTorchrunsRunId) {
  {
    Env env(Vars{{"TORCHELASTIC_RUN_ID", std::nullopt}});
    EXPECT_FALSE(torchamp::is_torchelastic_launched());
  }
  Env env(Vars{{"TORCHELASTIC_RUN_ID", "none"}});
  EXPECT_TRUE(torchamp::is_torchelastic_launched());
}

TEST(ProcessGroup, DefaultsArePythons) {
  EXPECT_EQ(torchamp::default_pg_timeout(), std::chrono::minutes(30));
  EXPECT_EQ(torchamp::default_pg_timeout("nccl"), std::chrono::minutes(10));
  EXPECT_TRUE(torchamp::is_backend_available("gloo"));
  EXPECT_FALSE(torchamp::is_backend_available("mpi"));
  EXPECT_EQ(ProcessGroupOptions().backend(), "");
  EXPECT_FALSE(ProcessGroupOptions().init_method().has_value());
  EXPECT_EQ(ProcessGroupOptions().rank(), -1);
  EXPECT_EQ(ProcessGroupOptions().world_size(), -1);
}

}  // namespace
