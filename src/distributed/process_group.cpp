// torchamp::init_process_group and new_group: Python's torch.distributed
// rendezvous and group formation (torch/distributed/rendezvous.py and
// distributed_c10d.py of PyTorch 2.13), in C++.
//
// Gloo's headers are needed here only: ProcessGroupGloo.hpp includes them.
// They come from beside the LibTorch or from Debian's libgloo-dev (CMake
// found them: TORCHAMP_WITH_GLOO in torchamp/config.h); the Gloo that runs is
// always the one inside the linked libtorch_cpu.

#include <torchamp/config.h>
#include <torchamp/process_group.h>

#include "compat/compat.h"
#include "distributed/device_backends.h"

#include <ATen/Context.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if TORCHAMP_WITH_GLOO && defined(USE_C10D_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define TORCHAMP_GLOO 1
#else
#define TORCHAMP_GLOO 0
#endif
#if TORCHAMP_WITH_NCCL && defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TORCHAMP_NCCL 1
#else
#define TORCHAMP_NCCL 0
#endif

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <utility>

namespace torchamp {
namespace {

using Millis = std::chrono::milliseconds;
using PG = c10::intrusive_ptr<c10d::ProcessGroup>;

// What Python's _World keeps of the default group.
struct World {
  std::mutex mutex;
  PG group;
  c10::intrusive_ptr<c10d::Store> store;  // PrefixStore("default_pg", rendezvous)
  std::string backend;
  Millis timeout{0};
  int group_count = 0;  // the next group's name
};

World& world() {
  static World w;
  return w;
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// A whole decimal integer, or a ValueError naming `what` and the text.
int parse_int(const std::string& what, const std::string& text) {
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  TORCH_CHECK_VALUE(!text.empty() && ec == std::errc() && ptr == end,
                    "torchamp::init_process_group: ", what, " is '", text, "', not an integer");
  return value;
}

void check_rank(int rank, int world_size) {
  TORCH_CHECK_VALUE(world_size >= 1, "torchamp::init_process_group: world_size is ", world_size,
                    ", not at least 1");
  TORCH_CHECK_VALUE(rank >= 0 && rank < world_size, "torchamp::init_process_group: rank ", rank,
                    " is not in [0, world_size) for world_size ", world_size);
}

struct Url {
  std::string text;
  std::string scheme;
  std::string netloc;
  std::string path;
  std::map<std::string, std::string> query;
};

// scheme://netloc/path?k=v&k=v, as much of urlparse as the three handlers use.
Url parse_url(const std::string& text) {
  Url url;
  url.text = text;
  const auto sep = text.find("://");
  TORCH_CHECK_VALUE(sep != std::string::npos && sep > 0,
                    "torchamp::init_process_group: init_method '", text,
                    "' is not a URL: env://, tcp://HOST:PORT or file:///PATH");
  url.scheme = text.substr(0, sep);
  std::string rest = text.substr(sep + 3);
  if (const auto q = rest.find('?'); q != std::string::npos) {
    std::stringstream query(rest.substr(q + 1));
    rest.resize(q);
    for (std::string pair; std::getline(query, pair, '&');) {
      if (pair.empty()) {
        continue;
      }
      const auto eq = pair.find('=');
      url.query[pair.substr(0, eq)] = eq == std::string::npos ? "" : pair.substr(eq + 1);
    }
  }
  const auto slash = rest.find('/');
  url.netloc = rest.substr(0, slash);
  url.path = slash == std::string::npos ? "" : rest.substr(slash);
  return url;
}

[[noreturn]] void rendezvous_error(const Url& url, const std::string& what) {
  TORCH_CHECK_VALUE(false, "Error initializing torch.distributed using ", url.scheme,
                    ":// rendezvous: ", what, " (torchamp::init_process_group, init_method '",
                    url.text, "')");
}

struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = -1;
  int world_size = -1;
  std::string where;  // for error messages
};

// The TCPStore of Python's _create_c10d_store.
c10::intrusive_ptr<c10d::Store> tcp_store(const std::string& host, int port, int rank,
                                          int world_size, Millis timeout, bool use_libuv,
                                          std::string& where) {
  TORCH_CHECK_VALUE(port >= 0 && port < 65536,
                    "torchamp::init_process_group: port must have value from 0 to 65535 but was ",
                    port);
  c10d::TCPStoreOptions options;
  options.numWorkers = static_cast<size_t>(world_size);
  options.timeout = timeout;
  const bool agent = env_or_empty("TORCHELASTIC_USE_AGENT_STORE") == "True";
  if (agent && compat::kTcpStoreJoinsAgentStore) {
    options.isServer = false;  // torchrun's agent serves it
  } else {
    if (agent) {
      port += 1;  // see compat::kTcpStoreJoinsAgentStore
    }
    options.isServer = rank == 0;
    options.multiTenant = true;
  }
  options.port = static_cast<uint16_t>(port);
  where = host + ":" + std::to_string(port) + (agent ? " (torchrun's agent store)" : "");
  // Every rank, client or server, asks as Python does: a LibTorch built
  // without libuv (Debian 13's 2.6) refuses a client's request too, and
  // TCPStoreOptions asks for libuv by default.
  const bool asked_libuv = compat::set_use_libuv(options, use_libuv);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const c10::Error& e) {
    // A LibTorch built without libuv (Debian's 2.6) refuses it; the classic
    // store then serves (and connects).
    if (!asked_libuv || std::string(e.what()).find("libuv") == std::string::npos) {
      throw;
    }
    compat::set_use_libuv(options, false);
    store = c10::make_intrusive<c10d::TCPStore>(host, options);
  }
  // torchrun's agent keeps its store across the restarts of --max-restarts:
  // without a prefix per attempt, a restarted rank reads the addresses the
  // previous attempt's ranks published and connects to processes that are
  // gone. (Python 2.13's static rendezvous has the same store and no prefix;
  // older Pythons had this one.)
  if (agent) {
    const std::string attempt = env_or_empty("TORCHELASTIC_RESTART_COUNT");
    store = c10::make_intrusive<c10d::PrefixStore>(
        "/worker/attempt_" + (attempt.empty() ? std::string("0") : attempt), store);
  }
  return store;
}

int query_int(const Url& url, const char* key) {
  return parse_int(std::string("the URL's ") + key, url.query.at(key));
}

// Python's rendezvous(url, rank, world_size) and its three handlers; fills
// `r` as it goes (its `where` names the store for an error on the way).
void rendezvous(const std::string& init_method, int rank, int world_size, Millis timeout,
                Rendezvous& r) {
  const Url url = parse_url(init_method);
  TORCH_CHECK_VALUE(url.scheme == "env" || url.scheme == "tcp" || url.scheme == "file",
                    "torchamp::init_process_group: No rendezvous handler for ", url.scheme,
                    ":// (init_method '", init_method, "'; env://, tcp:// and file:// are known)");
  TORCH_CHECK_VALUE(!(rank != -1 && url.query.count("rank")) &&
                        !(world_size != -1 && url.query.count("world_size")),
                    "torchamp::init_process_group: The url: ", init_method,
                    " has node-specific arguments(rank, world_size) already.");
  const bool use_libuv = url.query.count("use_libuv")
                             ? url.query.at("use_libuv") == "1"
                             : (std::getenv("USE_LIBUV") ? env_or_empty("USE_LIBUV") : "1") == "1";
  auto from = [&](const char* key, int given, const char* env) {
    if (given != -1) {
      return given;
    }
    if (url.query.count(key)) {
      return query_int(url, key);
    }
    if (env == nullptr) {
      rendezvous_error(url, std::string(std::strcmp(key, "rank") == 0 ? "rank" : "world size") +
                                " parameter missing");
    }
    const std::string value = env_or_empty(env);
    if (value.empty()) {
      rendezvous_error(url, std::string("environment variable ") + env + " expected, but not set");
    }
    return parse_int(std::string("environment variable ") + env, value);
  };
  if (url.scheme == "env") {
    r.rank = from("rank", rank, "RANK");
    r.world_size = from("world_size", world_size, "WORLD_SIZE");
    const std::string addr = env_or_empty("MASTER_ADDR");
    if (addr.empty()) {
      rendezvous_error(url, "environment variable MASTER_ADDR expected, but not set");
    }
    const std::string port = env_or_empty("MASTER_PORT");
    if (port.empty()) {
      rendezvous_error(url, "environment variable MASTER_PORT expected, but not set");
    }
    const int p = parse_int("environment variable MASTER_PORT", port);
    check_rank(r.rank, r.world_size);
    r.store = tcp_store(addr, p, r.rank, r.world_size, timeout, use_libuv, r.where);
  } else if (url.scheme == "tcp") {
    std::string host = url.netloc;
    std::string port;
    if (!host.empty() && host.front() == '[') {  // [v6]:port
      const auto close = host.find(']');
      port = close != std::string::npos && host.size() > close + 1 && host[close + 1] == ':'
                 ? host.substr(close + 2)
                 : "";
      host = host.substr(1, close == std::string::npos ? std::string::npos : close - 1);
    } else if (const auto colon = host.rfind(':'); colon != std::string::npos) {
      port = host.substr(colon + 1);
      host.resize(colon);
    }
    if (port.empty()) {
      rendezvous_error(url, "port number missing");
    }
    const int p = parse_int("the URL's port", port);
    r.rank = from("rank", rank, nullptr);
    r.world_size = from("world_size", world_size, nullptr);
    check_rank(r.rank, r.world_size);
    r.store = tcp_store(host, p, r.rank, r.world_size, timeout, use_libuv, r.where);
  } else {
    if (url.path.empty()) {
      rendezvous_error(url, "path missing");
    }
    r.rank = from("rank", rank, nullptr);
    r.world_size = from("world_size", world_size, nullptr);
    check_rank(r.rank, r.world_size);
    r.where = url.path;
    r.store = c10::make_intrusive<c10d::FileStore>(url.path, r.world_size);
  }
}

using BackendPtr = compat::backend_ptr<c10d::ProcessGroup>::type;

std::string lower(std::string s) {
  for (auto& c : s) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return s;
}

void check_available(const std::string& name) {
  if (name == "gloo") {
    TORCH_CHECK_NOT_IMPLEMENTED(
        TORCHAMP_GLOO,
        "torchamp: this libtorchamp was built without Gloo's headers, so it cannot form a Gloo "
        "process group. Install them (Debian: apt install libgloo-dev; or put them beside "
        "LibTorch's include/) and rebuild torchamp: CMake then says \"torchamp: Gloo process "
        "groups: ON\"");
  } else if (name == "nccl") {
    TORCH_CHECK_NOT_IMPLEMENTED(
        TORCHAMP_NCCL,
        "torchamp: this libtorchamp has no NCCL: build it against a CUDA LibTorch with NCCL "
        "(and nccl.h, which the pip wheel nvidia-nccl ships), or use backend \"gloo\"");
  }
}

// The backends this build lacks are NotImplementedErrors first (a CPU
// LibTorch asked for "nccl" says so, whatever the machine has); then the map,
// with "nccl" refused before any rendezvous where no CUDA device is present.
std::vector<std::pair<std::string, std::string>> device_backends(const std::string& given) {
  auto map = detail::device_backends(given, TORCHAMP_NCCL, at::hasCUDA());
  for (const auto& entry : map) {
    check_available(entry.second);
  }
  return map;
}

#if TORCHAMP_GLOO
// Python's ProcessGroupGloo(store, rank, size, timeout): a device per
// interface in GLOO_SOCKET_IFNAME (comma-separated), else the default one.
BackendPtr make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     Millis timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const std::string ifnames = env_or_empty("GLOO_SOCKET_IFNAME");
  if (ifnames.size() > 1) {
    std::stringstream list(ifnames);
    for (std::string name; std::getline(list, name, ',');) {
      try {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      } catch (const std::exception& e) {
        TORCH_CHECK_VALUE(false, "torchamp::init_process_group: GLOO_SOCKET_IFNAME is '", ifnames,
                          "': no Gloo device for interface '", name, "': ", e.what());
      }
    }
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  options->threads = static_cast<int>(options->devices.size()) * 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}
#endif

#if TORCHAMP_NCCL
BackendPtr make_nccl(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     Millis timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->is_high_priority_stream = false;
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}
#endif

// Python's _new_process_group_helper for a member of the group.
PG form_group(const c10::intrusive_ptr<c10d::Store>& default_store, const std::string& name,
              int rank, int size, const std::string& backend, Millis timeout) {
  const auto map = device_backends(backend);
  auto store = c10::make_intrusive<c10d::PrefixStore>(name + "/", default_store);
  auto group = compat::assemble_group<c10d::ProcessGroup, c10d::PrefixStore>(
      store, rank, size, map, timeout,
      [&](const std::string& which,
          const c10::intrusive_ptr<c10d::Store>& backend_store) -> BackendPtr {
#if TORCHAMP_NCCL
        if (which == "nccl") {
          return make_nccl(backend_store, rank, size, timeout);
        }
#endif
#if TORCHAMP_GLOO
        if (which == "gloo") {
          return make_gloo(backend_store, rank, size, timeout);
        }
#endif
        (void)backend_store;
        check_available(which);  // throws
        TORCH_CHECK(false, "torchamp: no backend ", which);
      });
  compat::set_group_name(*group, name);
  return group;
}

std::string describe(int rank, int size, const std::string& where, Millis timeout) {
  return "torchamp::init_process_group: rank " + std::to_string(rank) + " of " +
         std::to_string(size) + " at " + where + ", timeout " + std::to_string(timeout.count()) +
         " ms";
}

// Runs `step`. c10d's errors (and LibTorch 1.13's socket errors, which are
// not c10::Errors) leave it with `context()` added; torchamp's own typed
// errors (bad input, a backend this build lacks) pass as they are.
template <class Step, class Context>
auto with_context(const Step& step, const Context& context) -> decltype(step()) {
  try {
    return step();
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::NotImplementedError&) {
    throw;
  } catch (c10::Error& e) {
    e.add_context(context());
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what(), "\n", context());
  }
}

// A peer that dies mid-collective leaves its sockets closed; Gloo's next
// write to one raises SIGPIPE, whose default action kills this process
// silently (exit status 141, no message) instead of failing the collective
// with an error. Python's interpreter ignores SIGPIPE from start-up, so
// PyTorch's DDP reports the dead peer; init_process_group does the same where
// the program left the default in place (a program's own handler, or its own
// SIG_IGN, is kept), and puts the default back when it throws.
class SigpipeIgnored {
 public:
  SigpipeIgnored() {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
        (current.sa_flags & SA_SIGINFO) == 0) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      changed_ = ::sigaction(SIGPIPE, &ignore, nullptr) == 0;
    }
  }
  SigpipeIgnored(const SigpipeIgnored&) = delete;
  SigpipeIgnored& operator=(const SigpipeIgnored&) = delete;
  ~SigpipeIgnored() {
    if (changed_) {  // the call threw: as it was
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      ::sigaction(SIGPIPE, &dfl, nullptr);
    }
  }
  void keep() { changed_ = false; }

 private:
  bool changed_ = false;
};

}  // namespace

namespace detail {

// Python's BackendConfig (torch/distributed/distributed_c10d.py). Python
// 2.6+ maps None to the detected accelerator's backend alone; we keep Gloo
// for CPU tensors beside NCCL where a GPU is present, as Python up to 2.5
// did (a C++ program's CPU tensors, a found-inf flag among them, keep a
// backend), and Gloo alone where none is: NCCL cannot form without a GPU.
std::vector<std::pair<std::string, std::string>> device_backends(const std::string& given,
                                                                 bool nccl_built,
                                                                 bool gpu_present) {
  const std::string backend = lower(given);
  std::vector<std::pair<std::string, std::string>> map;
  auto known = [&](const std::string& name) {
    TORCH_CHECK_VALUE(name == "gloo" || name == "nccl",
                      "torchamp::init_process_group: unknown backend '", given,
                      "' (gloo, nccl, or one per device as \"cpu:gloo,cuda:nccl\")");
  };
  if (backend.empty()) {  // Python's None
    map = {{"cpu", "gloo"}, {"cuda", nccl_built && gpu_present ? "nccl" : "gloo"}};
  } else if (backend.find(':') == std::string::npos) {
    known(backend);
    if (backend == "gloo") {
      map = {{"cpu", "gloo"}, {"cuda", "gloo"}};
    } else {
      map = {{"cuda", "nccl"}};
    }
  } else {
    std::stringstream list(backend);
    for (std::string item; std::getline(list, item, ',');) {
      const auto colon = item.find(':');
      const std::string device = item.substr(0, colon);
      TORCH_CHECK_VALUE(colon != std::string::npos && (device == "cpu" || device == "cuda"),
                        "torchamp::init_process_group: backend '", given, "': '", item,
                        "' is not DEVICE:BACKEND with DEVICE cpu or cuda");
      known(item.substr(colon + 1));
      map.emplace_back(device, item.substr(colon + 1));
    }
  }
  if (nccl_built) {  // a build without NCCL says so instead (check_available)
    for (const auto& entry : map) {
      TORCH_CHECK_VALUE(entry.second != "nccl" || gpu_present,
                        "torchamp::init_process_group: backend '", given,
                        "' asks for NCCL, which needs a CUDA device, and this machine has none "
                        "(ProcessGroupNCCL is only supported with GPUs, no GPUs found!); use "
                        "backend \"gloo\", or leave it unset: Gloo alone where no GPU is present");
    }
  }
  return map;
}

}  // namespace detail

std::chrono::milliseconds default_pg_timeout(const std::string& backend) {
  return lower(backend) == "nccl" ? Millis(std::chrono::minutes(10))
                                  : Millis(std::chrono::minutes(30));
}

bool is_backend_available(const std::string& backend) {
  const std::string b = lower(backend);
  return (b == "gloo" && TORCHAMP_GLOO) || (b == "nccl" && TORCHAMP_NCCL);
}

bool is_torchelastic_launched() {
  return std::getenv("TORCHELASTIC_RUN_ID") != nullptr;
}

c10::intrusive_ptr<c10d::ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  TORCH_CHECK_VALUE(!w.group,
                    "torchamp::init_process_group: trying to initialize the default "
                    "process group twice! (destroy_process_group() first)");
  const Millis timeout = options.timeout().value_or(default_pg_timeout(options.backend()));
  TORCH_CHECK_VALUE(timeout.count() > 0, "torchamp::init_process_group: timeout is ",
                    timeout.count(), " ms, not positive");
  device_backends(options.backend());  // a bad or missing backend fails before any rendezvous
  SigpipeIgnored sigpipe;              // before the rendezvous: TCPStore's sockets too
  Rendezvous r;
  if (options.store()) {
    TORCH_CHECK_VALUE(!options.init_method(),
                      "torchamp::init_process_group: Cannot specify both "
                      "init_method and store.");
    TORCH_CHECK_VALUE(options.rank() != -1 && options.world_size() != -1,
                      "torchamp::init_process_group: with a store, rank (", options.rank(),
                      ") and world_size (", options.world_size(), ") must be given");
    check_rank(options.rank(), options.world_size());
    r.store = options.store();
    r.rank = options.rank();
    r.world_size = options.world_size();
    r.where = "the given store";
  } else {
    const std::string method = options.init_method().value_or("env://");
    r.where = method;
    with_context([&] { rendezvous(method, options.rank(), options.world_size(), timeout, r); },
                 [&] {
                   return describe(r.rank, r.world_size, r.where, timeout) +
                          ": the rendezvous failed (a peer that never arrived?)";
                 });
  }
  r.store->setTimeout(timeout);
  auto store = c10::make_intrusive<c10d::PrefixStore>("default_pg", r.store);
  PG group = with_context(
      [&] { return form_group(store, "0", r.rank, r.world_size, options.backend(), timeout); },
      [&] {
        return describe(r.rank, r.world_size, r.where, timeout) +
               ": forming the group failed (a peer that never arrived?)";
      });
  w.store = store;
  w.group = group;
  w.backend = options.backend();
  w.timeout = timeout;
  w.group_count = 1;
  sigpipe.keep();
  return group;
}

c10::intrusive_ptr<c10d::ProcessGroup> new_group(const NewGroupOptions& options) {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  TORCH_CHECK_VALUE(w.group,
                    "torchamp::new_group: Default process group has not been "
                    "initialized, please make sure to call init_process_group.");
  const int world_size = w.group->getSize();
  const int rank = w.group->getRank();
  std::vector<int> ranks = options.ranks();
  std::sort(ranks.begin(), ranks.end());
  for (size_t i = 0; i < ranks.size(); ++i) {
    TORCH_CHECK_VALUE(ranks[i] >= 0 && ranks[i] < world_size, "torchamp::new_group: rank ",
                      ranks[i], " in ranks is not in [0, ", world_size, ")");
    TORCH_CHECK_VALUE(i == 0 || ranks[i] != ranks[i - 1], "torchamp::new_group: rank ", ranks[i],
                      " appears twice in ranks");
  }
  const std::string backend = options.backend().empty() ? w.backend : options.backend();
  const Millis timeout = options.timeout().value_or(w.timeout);
  TORCH_CHECK_VALUE(timeout.count() > 0, "torchamp::new_group: timeout is ", timeout.count(),
                    " ms, not positive");
  device_backends(backend);
  // Every rank takes the next name, members or not (Python's group count).
  const std::string name = std::to_string(w.group_count++);
  int group_rank = rank;
  int group_size = world_size;
  if (!ranks.empty()) {
    const auto it = std::find(ranks.begin(), ranks.end(), rank);
    if (it == ranks.end()) {
      return {};  // GroupMember.NON_GROUP_MEMBER
    }
    group_rank = static_cast<int>(it - ranks.begin());
    group_size = static_cast<int>(ranks.size());
  }
  return with_context(
      [&] { return form_group(w.store, name, group_rank, group_size, backend, timeout); },
      [&] {
        return "torchamp::new_group: group " + name + ", rank " + std::to_string(group_rank) +
               " of " + std::to_string(group_size) + ", timeout " +
               std::to_string(timeout.count()) + " ms";
      });
}

bool is_initialized() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  return static_cast<bool>(w.group);
}

c10::intrusive_ptr<c10d::ProcessGroup> default_process_group() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  TORCH_CHECK_VALUE(w.group,
                    "torchamp::default_process_group: Default process group has not "
                    "been initialized, please make sure to call init_process_group.");
  return w.group;
}

void destroy_process_group() {
  World& w = world();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.group.reset();
  w.store.reset();
  w.backend.clear();
  w.group_count = 0;
}

}  // namespace torchamp
