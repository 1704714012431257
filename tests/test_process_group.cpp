// torchamp::init_process_group and new_group in this process: bad input is a
// typed error that names what is wrong and changes nothing, a peer that never
// arrives is an error within the timeout, and a one-rank group works.
// (Several ranks: the new-group scenario in test_distributed.cpp, and the
// tests that run torchrun.)

#include <torchamp/process_group.h>

#include <ATen/ops/full.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using torchamp::ProcessGroupOptions;

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

// The message of the `Error` that `call` throws ("" and a failure if none).
template <class Error>
std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "another error: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

std::string value_error(const ProcessGroupOptions& options) {
  const std::string msg =
      message_of<c10::ValueError>([&] { torchamp::init_process_group(options); });
  EXPECT_FALSE(torchamp::is_initialized()) << msg;
  return msg;
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
      const std::string msg = value_error({});
      EXPECT_NE(msg.find(std::string("environment variable ") + name + " expected, but not set"),
                std::string::npos)
          << msg;
    }
  }
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_PORT"}) {
    Env env(torchrun_but(name, "1x"));
    const std::string msg = value_error({});
    EXPECT_NE(msg.find(std::string("environment variable ") + name + " is '1x', not an integer"),
              std::string::npos)
        << msg;
  }
  Env env(torchrun_but("MASTER_PORT", "70000"));
  EXPECT_NE(value_error({}).find("port must have value from 0 to 65535 but was 70000"),
            std::string::npos);
}

TEST(ProcessGroup, ARankOutsideTheWorldIsAValueError) {
  Env env(torchrun_but("RANK", "2"));
  EXPECT_NE(value_error({}).find("rank 2 is not in [0, world_size) for world_size 1"),
            std::string::npos);
  EXPECT_NE(
      value_error(ProcessGroupOptions().rank(-3).world_size(2).init_method("tcp://127.0.0.1:29500"))
          .find("rank -3 is not in [0, world_size) for world_size 2"),
      std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().init_method("file:///tmp/x?rank=0&world_size=0"))
                .find("world_size is 0, not at least 1"),
            std::string::npos);
}

TEST(ProcessGroup, AnUnknownBackendOrInitMethodIsAValueError) {
  Env env(kTorchrun);
  EXPECT_NE(value_error(ProcessGroupOptions().backend("mpi")).find("unknown backend 'mpi'"),
            std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().backend("cpu:gloo,tpu:gloo")).find("'tpu:gloo'"),
            std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().init_method("etcd://h:1"))
                .find("No rendezvous handler for etcd://"),
            std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().init_method("localhost")).find("is not a URL"),
            std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().init_method("tcp://127.0.0.1?rank=0&world_size=1"))
                .find("tcp:// rendezvous: port number missing"),
            std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().init_method("file:///tmp/x?world_size=1"))
                .find("file:// rendezvous: rank parameter missing"),
            std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().timeout(std::chrono::milliseconds(0)))
                .find("timeout is 0 ms, not positive"),
            std::string::npos);
  const fs::path path =
      fs::path(::testing::TempDir()) / ("torchamp-pg-store-" + std::to_string(::getpid()));
  auto store = c10::make_intrusive<c10d::FileStore>(path.string(), 1);
  EXPECT_NE(value_error(ProcessGroupOptions().store(store).init_method("env://"))
                .find("Cannot specify both init_method and store."),
            std::string::npos);
  EXPECT_NE(value_error(ProcessGroupOptions().store(store)).find("rank (-1) and world_size (-1)"),
            std::string::npos);
  fs::remove(path);
}

TEST(ProcessGroup, APeerThatNeverArrivesIsAnErrorWithinTheTimeout) {
  Env env(kTorchrun);
  const auto timeout = std::chrono::milliseconds(1500);
  const int port = free_port();
  // Rank 0 of 2 serves and waits for rank 1; rank 1 of 2 finds no server.
  for (int rank : {0, 1}) {
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = message_of<c10::Error>([&] {
      torchamp::init_process_group(ProcessGroupOptions()
                                       .init_method("tcp://127.0.0.1:" + std::to_string(port))
                                       .rank(rank)
                                       .world_size(2)
                                       .timeout(timeout));
    });
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_FALSE(torchamp::is_initialized());
    EXPECT_LT(took, timeout + std::chrono::seconds(5)) << "rank " << rank;
    if (rank == 0) {  // the server waits the whole timeout for its client
      EXPECT_GE(took, timeout - std::chrono::milliseconds(100));
    }
    EXPECT_NE(msg.find("rank " + std::to_string(rank) +
                       " of 2 at 127.0.0.1:" + std::to_string(port) + ", timeout 1500 ms"),
              std::string::npos)
        << msg;
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
  EXPECT_NE(message_of<c10::ValueError>([] {
              torchamp::default_process_group();
            }).find("has not been initialized"),
            std::string::npos);
  auto group = torchamp::init_process_group(options);
  ASSERT_TRUE(group);
  EXPECT_TRUE(torchamp::is_initialized());
  EXPECT_EQ(torchamp::default_process_group().get(), group.get());
  EXPECT_EQ(group->getRank(), 0);
  EXPECT_EQ(group->getSize(), 1);
  std::vector<at::Tensor> t = {at::full({3}, 2.0)};
  group->allreduce(t)->wait();
  EXPECT_EQ(t[0][0].item<double>(), 2.0);

  EXPECT_NE(message_of<c10::ValueError>([&] {
              torchamp::init_process_group(options);
            }).find("initialize the default process group twice"),
            std::string::npos);
  EXPECT_EQ(torchamp::default_process_group().get(), group.get());

  auto all = torchamp::new_group();
  ASSERT_TRUE(all);
  all->allreduce(t)->wait();
  EXPECT_TRUE(torchamp::new_group(torchamp::NewGroupOptions().ranks({0})));
  EXPECT_NE(message_of<c10::ValueError>([] {
              torchamp::new_group(torchamp::NewGroupOptions().ranks({0, 1}));
            }).find("rank 1 in ranks is not in [0, 1)"),
            std::string::npos);
  EXPECT_NE(message_of<c10::ValueError>([] {
              torchamp::new_group(torchamp::NewGroupOptions().backend("foo"));
            }).find("unknown backend 'foo'"),
            std::string::npos);

  torchamp::destroy_process_group();
  EXPECT_FALSE(torchamp::is_initialized());
  fs::remove(store);
  auto again = torchamp::init_process_group(options);
  EXPECT_TRUE(again);
  torchamp::destroy_process_group();
  fs::remove(store);
}

TEST(ProcessGroup, ABadGlooSocketIfnameIsAValueErrorNamingIt) {
  const fs::path store =
      fs::path(::testing::TempDir()) / ("torchamp-pg-ifname-" + std::to_string(::getpid()));
  fs::remove(store);
  Env env(Vars{{"GLOO_SOCKET_IFNAME", "lo,nosuch0"}});
  const std::string msg = value_error(
      ProcessGroupOptions().init_method("file://" + store.string()).rank(0).world_size(1));
  EXPECT_NE(msg.find("GLOO_SOCKET_IFNAME is 'lo,nosuch0': no Gloo device for interface 'nosuch0'"),
            std::string::npos)
      << msg;
  fs::remove(store);
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
