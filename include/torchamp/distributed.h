#pragma once

/// \file
/// Agreement on overflow across the ranks of a c10d process group.
///
/// When is it needed? Whenever a rank's optimizer sees gradients that other
/// ranks do not: sharded optimizer state (ZeRO-style), tensor or pipeline
/// parallelism, any reduce-scatter of gradients. If one rank overflows and
/// another does not, they disagree about skipping, their scales drift apart
/// and the model silently diverges. With a process group set, `unscale_`
/// (and `step`) all-reduces this optimizer's found-inf flag (one element,
/// MAX) before anything is unscaled or any stage changes, so every rank
/// records the same result, skips the same steps and keeps the same scale.
///
/// When not? Plain data parallelism with a full gradient all-reduce before
/// the step (DDP-style): every rank already holds identical gradients and
/// reaches the same decision alone; the extra collective would only cost
/// latency.
///
/// Works with any `c10d::ProcessGroup` (Gloo for CPU tensors; NCCL for CUDA
/// tensors and MPI where the linked LibTorch has them): the flag lives on the
/// device of the optimizer's gradients. Every rank must call `unscale_`/`step`
/// for the same optimizers in the same order, as with any collective.

#include <torchamp/config.h>

#if !TORCHAMP_WITH_DISTRIBUTED
#error "this torchamp was built with -DTORCHAMP_WITH_DISTRIBUTED=OFF: no process groups, no DDP"
#endif

#include <torchamp/grad_scaler.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <optional>

namespace torchamp {

/// A reducer for `GradScaler::set_found_inf_reducer`: all-reduces the flag
/// over `group` with MAX and waits for it, at most `timeout` when given (else
/// the group's own timeout). A failed or timed-out collective throws
/// `c10::Error` naming the rank, the group size and the cause; the scaler
/// then changes nothing. Throws `c10::ValueError` for a null group.
GradScaler::FoundInfReducer all_reduce_found_inf(
    c10::intrusive_ptr<c10d::ProcessGroup> group,
    std::optional<std::chrono::milliseconds> timeout = std::nullopt);

/// Gives the scaler a process group (see above); a null group removes it.
/// Any scaler with `set_found_inf_reducer`: torchamp::GradScaler and the
/// facades over it (torchamp::paddle::GradScaler).
template <class Scaler>
void set_process_group(Scaler& scaler, c10::intrusive_ptr<c10d::ProcessGroup> group,
                       std::optional<std::chrono::milliseconds> timeout = std::nullopt) {
  scaler.set_found_inf_reducer(group ? all_reduce_found_inf(std::move(group), timeout)
                                     : GradScaler::FoundInfReducer());
}

}  // namespace torchamp
