#pragma once

/// \file
/// Agreement on overflow across the ranks of a c10d process group.
///
/// Needed where a rank's optimizer sees gradients other ranks do not (sharded
/// state, tensor or pipeline parallelism): with it every rank skips the same
/// steps and keeps the same scale. Not needed under DDP, whose ranks hold the
/// same gradients. Any c10d group; every rank calls `unscale_`/`step` for the
/// same optimizers in the same order. In full: docs/distributed.md.

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
