#pragma once

/// \file
/// Process groups in one line, as Python's `torch.distributed` forms them:
///
/// ```cpp
/// auto group = torchamp::init_process_group();  // dist.init_process_group("gloo")
/// ```
///
/// Under torchrun that is all (`env://`); `tcp://` and `file://` work as in
/// Python. Gloo groups for CPU tensors, NCCL's for CUDA ones where built,
/// formed inside libtorchamp so that no program needs Gloo's headers. Errors
/// are typed (`c10::ValueError` for a bad variable, URL or rank,
/// `c10::NotImplementedError` for a backend this build lacks, `c10::Error`
/// for a peer that never arrives) and nothing waits past the timeout. In
/// full: docs/distributed.md.

#include <torchamp/config.h>

#if !TORCHAMP_WITH_DISTRIBUTED
#error "this torchamp was built with -DTORCHAMP_WITH_DISTRIBUTED=OFF: no process groups, no DDP"
#endif

#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace torchamp {

/// `dist.init_process_group`'s arguments, with Python's names and defaults.
struct ProcessGroupOptions {
  /// "gloo", "nccl", or Python's per-device form ("cpu:gloo,cuda:nccl"). The
  /// default, "", is Python's `None`: Gloo for CPU tensors, and NCCL for
  /// CUDA tensors where this torchamp has NCCL and a CUDA device is present;
  /// Gloo alone otherwise. "nccl" without a CUDA device is a `c10::ValueError`.
  TORCH_ARG(std::string, backend) = "";
  /// "env://" (the default when no `store` is given), "tcp://host:port" or
  /// "file:///path", each with an optional query (`?rank=R&world_size=N`).
  TORCH_ARG(std::optional<std::string>, init_method) = std::nullopt;
  /// -1: from RANK (env://) or the URL's query.
  TORCH_ARG(int, rank) = -1;
  /// -1: from WORLD_SIZE (env://) or the URL's query.
  TORCH_ARG(int, world_size) = -1;
  /// Python's default: 30 minutes for Gloo, 10 minutes for NCCL. The
  /// rendezvous, every peer's arrival and every collective without its own
  /// timeout wait at most this long.
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout) = std::nullopt;
  /// A store of your own instead of a rendezvous (Python's `store=`); then
  /// `rank` and `world_size` must be given and `init_method` must not.
  TORCH_ARG(c10::intrusive_ptr<c10d::Store>, store) = {};
};

/// Forms the default process group, as `dist.init_process_group(...)`, and
/// returns it. Every rank calls it once; it returns when every rank's Gloo
/// device is connected (or throws, see the file's comment). A second call
/// before `destroy_process_group()` is a `c10::ValueError`. Where the program
/// left SIGPIPE's default action it sets `SIG_IGN`, as Python's interpreter
/// does, so that a dead peer fails a collective instead of killing this
/// process (docs/distributed.md).
c10::intrusive_ptr<c10d::ProcessGroup> init_process_group(const ProcessGroupOptions& options = {});

/// `dist.new_group(ranks, timeout, backend)`: another group over the default
/// group's rendezvous. Every rank of the default group calls it, in the same
/// order as the others (the groups are numbered, as in Python). `ranks`
/// empty: every rank. A rank not in `ranks` gets a null pointer
/// (`GroupMember.NON_GROUP_MEMBER`); a member's rank in the new group is its
/// place in `ranks`, sorted. `timeout` and `backend` default to the default
/// group's.
struct NewGroupOptions {
  TORCH_ARG(std::vector<int>, ranks) = {};
  TORCH_ARG(std::optional<std::chrono::milliseconds>, timeout) = std::nullopt;
  TORCH_ARG(std::string, backend) = "";
};
c10::intrusive_ptr<c10d::ProcessGroup> new_group(const NewGroupOptions& options = {});

/// Whether `init_process_group` has formed the default group.
bool is_initialized();

/// The default group (`dist.group.WORLD`); a `c10::ValueError` before
/// `init_process_group`.
c10::intrusive_ptr<c10d::ProcessGroup> default_process_group();

/// Forgets the default group and every group `new_group` formed from it, as
/// `dist.destroy_process_group()`; `init_process_group` may then be called
/// again. Groups a caller still holds stay usable until released.
void destroy_process_group();

/// Python's default timeout for `backend` ("nccl": 10 minutes; otherwise 30).
std::chrono::milliseconds default_pg_timeout(const std::string& backend = "gloo");

/// Which backends this build of torchamp can form ("gloo", "nccl").
bool is_backend_available(const std::string& backend);

/// Whether torchrun (torch.distributed.run / elastic) started this process:
/// Python's `dist.is_torchelastic_launched()` (TORCHELASTIC_RUN_ID is set).
bool is_torchelastic_launched();

}  // namespace torchamp
