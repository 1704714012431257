#pragma once

// Whether work queued now is being captured into a CUDA graph, asked by the
// calls that would otherwise run host work a graph's replays skip or read a
// flag back (which capture refuses with a CUDA error that names nothing).

#include <torchamp/config.h>  // TORCHAMP_WITH_CUDA

#include <c10/core/Device.h>

namespace torchamp {
namespace compat {

/// Whether this LibTorch can capture at all (a CUDA build): where not, the
/// checks around capture need not look.
constexpr bool kCanCapture = TORCHAMP_WITH_CUDA;

/// Whether `device`'s current CUDA stream is capturing a graph; false off
/// CUDA and where LibTorch has no CUDA.
bool capturing(c10::Device device);

}  // namespace compat
}  // namespace torchamp
