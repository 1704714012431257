#pragma once

// Internal interface of the kernel layer (not installed).
//
// Fused multi-tensor "unscale + non-finite check" and "check only" over lists
// of gradients. The GradScaler calls these; nothing here knows about
// optimizers or stages.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

// Hot loops are compiled for AVX2 and for the baseline, and the AVX2 clone is
// picked at load time where the CPU has it (GCC function multi-versioning).
// Feature names only: an "arch=" clone is picked only on that exact CPU model.
// AVX-512 adds nothing to a memory-bound loop, and without AVX512BW (not
// accepted here) its 16-bit lanes are slower. The benchmark's ceiling loops use
// the same macro.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__) && defined(__linux__)
#define TORCHAMP_TARGET_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TORCHAMP_TARGET_CLONES
#endif

namespace torchamp {
namespace kernels {

/// True for the dtypes the CPU kernels handle: float32, float64, bfloat16 and
/// float16 (the last for ATen's op; the GradScaler refuses float16 gradients).
bool cpu_supports(at::ScalarType dtype);

/// For every tensor: `x = x * inv_scale` in place, computed as ATen's
/// `_amp_foreach_non_finite_check_and_unscale_` does (float32 arithmetic for
/// float32 and bfloat16, the latter rounded back to bfloat16 once; float64
/// arithmetic with `double(inv_scale)` for float64; float16 as bfloat16), and
/// whether any *input*
/// element was inf or NaN.
///
/// Tensors must be dense CPU tensors of a `cpu_supports` dtype (any mix);
/// contiguous ones are processed in place in one pass, others through a
/// contiguous copy. Work is split across and within tensors with
/// at::parallel_for. When `per_tensor_found` is given it is resized to
/// `tensors.size()` and entry i says whether tensor i held a non-finite value.
/// With inv_scale == 1 nothing is written (a check only).
bool unscale_cpu_(c10::ArrayRef<at::Tensor> tensors, float inv_scale,
                  std::vector<uint8_t>* per_tensor_found = nullptr);

/// The loop `unscale_cpu_` runs for bfloat16: "avx512-bf16" where the CPU and
/// OS have AVX-512 BF16 (VCVTNEPS2BF16), else "portable". Both give identical
/// bits. The environment variable TORCHAMP_PORTABLE_KERNELS (any value) or
/// `force_portable_bf16(true)` (tests, benchmarks) picks the portable one.
const char* bf16_unscale_path();
void force_portable_bf16(bool on);

/// Read-only variant: whether any element of any tensor is inf or NaN.
bool check_cpu(c10::ArrayRef<at::Tensor> tensors, std::vector<uint8_t>* per_tensor_found = nullptr);

}  // namespace kernels
}  // namespace torchamp
