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

}  // namespace torchamp
