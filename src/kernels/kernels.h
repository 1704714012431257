#pragma once

// Internal interface of the kernel layer (not installed).
//
// Fused multi-tensor "unscale + non-finite check" and "check only" over lists
// of gradients. The GradScaler calls these; nothing here knows about
// optimizers or stages.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <algorithm>
#include <atomic>
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

/// Elements per parallel work item of the CPU kernels: large enough to
/// amortise scheduling, small enough that 10,000 small tensors still spread
/// over every thread.
constexpr int64_t kGrain = 1 << 15;

/// The kernels' one way of splitting work: over the concatenation of spans
/// whose prefix sums are `offsets` (offsets[i]: first element of span i;
/// back(): the total), across ATen's intra-op threads in pieces of at least a
/// grain (below one grain, all on the calling thread). Calls
/// f(span, begin, end) for each non-empty piece [begin, end) of a span.
template <class F>
void for_each_piece(const std::vector<int64_t>& offsets, const F& f) {
  at::parallel_for(0, offsets.back(), kGrain, [&](int64_t begin, int64_t end) {
    auto s = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), begin) -
                                 offsets.begin() - 1);
    for (int64_t pos = begin; pos < end; ++s) {
      const int64_t stop = std::min(end, offsets[s + 1]);
      if (stop > pos) {
        f(s, pos - offsets[s], stop - offsets[s]);
      }
      pos = stop;
    }
  });
}

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

/// What this CPU and its OS offer the kernels and `cpu_has_fast` (CPUID and
/// XGETBV on x86, the auxiliary vector on Arm Linux; read once per process).
struct CpuFeatures {
  bool avx2_f16c = false;    // AVX2 and F16C
  bool avx512 = false;       // AVX512 F, DQ, BW and VL
  bool avx512_bf16 = false;  // and AVX512_BF16
  bool avx512_fp16 = false;  // and AVX512_FP16
  bool amx_bf16 = false;     // AMX tiles with BF16 (and the OS saves them)
  bool amx_fp16 = false;     // AMX tiles with FP16
  bool arm_bf16 = false;     // Arm: the BF16 instructions
  bool arm_fp16 = false;     // Arm: half-precision vector arithmetic
};
const CpuFeatures& cpu_features();

/// The instruction sets of the kernels' run-time dispatch, in order. Every
/// vector loop gives the portable loop's bits.
enum class Isa : uint8_t { portable, avx2, avx512 };
/// The best one a kernel may pick: cpu_features(), capped by `cap_isa`
/// (tests, benchmarks) or by the environment variable
/// TORCHAMP_PORTABLE_KERNELS (any value: portable). The portable loops are
/// the compiler's AVX2 or baseline clones (TORCHAMP_TARGET_CLONES).
Isa vector_isa();
void cap_isa(Isa isa);
Isa isa_cap();
const char* isa_name(Isa isa);  // "portable", "avx2-f16c", "avx512"
/// cap_isa(Isa::portable), or (false) no cap.
void force_portable(bool on);

/// The loop `unscale_cpu_` runs for `dtype`: "avx512" (float32) or
/// "avx512-bf16" (bfloat16, VCVTNE2PS2BF16) where the CPU and OS have
/// AVX-512 (and AVX512_BF16 for bfloat16) and the cap allows it, else
/// "portable". Both give identical bits.
const char* unscale_path(at::ScalarType dtype);

/// Read-only variant: whether any element of any tensor is inf or NaN.
bool check_cpu(c10::ArrayRef<at::Tensor> tensors, std::vector<uint8_t>* per_tensor_found = nullptr);

/// A prepared list of dense CPU buffers, the kernels' own input: what
/// `unscale_cpu_` builds from its tensors on every call, and what the
/// GradScaler keeps between steps so that a step allocates nothing and looks
/// nothing up per tensor. It holds raw pointers: whoever fills it keeps the
/// buffers alive and unchanged until `run` returns.
class SpanList {
 public:
  void clear();
  void reserve(size_t n);
  /// Appends `numel` (> 0) elements of `dtype` (a `cpu_supports` dtype) at `data`.
  void add(void* data, int64_t numel, at::ScalarType dtype);
  /// Points span i at new data of the same dtype and element count.
  void set_data(size_t i, void* data) { spans_[i].data = data; }
  size_t size() const { return spans_.size(); }
  int64_t total_elements() const { return offsets_.back(); }

  /// `x = x * inv_scale` over every span (`write`, as `unscale_cpu_`), or a
  /// check only; returns whether any input element was inf or NaN. Totals of
  /// at least a parallel grain are split across at::get_num_threads() threads
  /// (across and within spans); the results and flags do not depend on the
  /// split. Afterwards `found(i)` says whether span i held an inf/NaN.
  bool run(bool write, float inv_scale);
  /// The read-only check of `run(false, 1)` that also sums the squares of
  /// every element (in double, whatever the dtype) into `*sum_squares`. The
  /// spans are summed in fixed blocks of kGrain elements, each block's sum
  /// added in order, so the result is the same bits on any number of threads.
  bool check_sum_squares(double* sum_squares);
  bool found(size_t i) const { return found_[i].load(std::memory_order_relaxed) != 0; }

  // Data of the spans, read by the parallel loop.
  struct Span {
    void* data;
    int64_t numel;
    at::ScalarType dtype;
  };

 private:
  void reset_found();  // sizes found_ to the spans, all 0

  std::vector<Span> spans_;
  std::vector<int64_t> offsets_{0};  // offsets_[i]: first element of span i; back(): the total
  std::vector<std::atomic<uint8_t>> found_;  // value-initialised (0) when sized
  bool any_found_ = false;                   // some found_ entry is 1
};

}  // namespace kernels
}  // namespace torchamp
