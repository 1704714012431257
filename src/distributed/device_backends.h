#pragma once

// Internal (not installed): the backend of each device type for a
// process-group `backend` string, as Python's BackendConfig maps it.

#include <string>
#include <utility>
#include <vector>

namespace torchamp {
namespace detail {

/// {device, backend} pairs for `backend` ("", "gloo", "nccl" or
/// "cpu:gloo,cuda:nccl"). "" is Python's `None`: Gloo for CPU tensors, and
/// NCCL for CUDA tensors only where `nccl_built` and `gpu_present` (Python
/// picks the backend of the accelerator it finds); otherwise Gloo alone.
/// Throws `c10::ValueError` for an unknown backend or device, and for NCCL
/// asked for by name where `gpu_present` is false (Python's "no GPUs found").
std::vector<std::pair<std::string, std::string>> device_backends(const std::string& backend,
                                                                 bool nccl_built, bool gpu_present);

}  // namespace detail
}  // namespace torchamp
