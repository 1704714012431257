#pragma once

/// \file
/// A c10d process group over Gloo, built the same way on LibTorch 1.13 and
/// 2.x. In 1.13 `c10d::ProcessGroupGloo` is a `c10d::ProcessGroup`; from 2.0
/// on it is a `c10d::Backend` that a `c10d::ProcessGroup` wraps. Python's
/// `dist.new_group(backend="gloo")` hides this; in C++ this header does.
///
/// Header-only, and not included by torchamp/torchamp.h: it needs Gloo's own
/// headers, which `ProcessGroupGloo.hpp` includes (Debian: `libgloo-dev`; the
/// pip wheels ship none, use Python's `torch.distributed` there).

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>
#include <type_traits>
#include <utility>

namespace torchamp {

/// A Gloo process group of `world` ranks, this one `rank`, meeting at `store`
/// (a `c10d::TCPStore` or `c10d::FileStore`), for
/// `torchamp::set_process_group` or your own collectives.
inline c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options) {
#if TORCH_VERSION_MAJOR >= 2
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  return group;
#else
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
#endif
}

namespace detail {

template <class T, class = void>
struct has_use_libuv : std::false_type {};
template <class T>
struct has_use_libuv<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

template <class Options>
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, Options options) {
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const c10::Error& e) {
    if constexpr (has_use_libuv<Options>::value) {
      if (options.useLibUV && std::string(e.what()).find("libuv") != std::string::npos) {
        options.useLibUV = false;
        return c10::make_intrusive<c10d::TCPStore>(host, options);
      }
    }
    throw;
  }
}

}  // namespace detail

/// A `c10d::TCPStore` at `host` (rank 0's machine) with these options. From
/// 2.4 on LibTorch asks for its libuv server by default, and a LibTorch built
/// without libuv (Debian's 2.6) throws "use_libuv was requested but PyTorch
/// was build without libuv support"; this then uses the classic server, as
/// Python's torch.distributed does.
inline c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host,
                                                      const c10d::TCPStoreOptions& options) {
  return detail::make_tcp_store(host, options);
}

}  // namespace torchamp
