// CPU kernels: one read (and at most one write) per element, vectorised by the
// compiler (this file is built with -O3; the span loops are cloned for AVX2
// and picked at load time; bfloat16 unscaling has an AVX-512 BF16 loop picked
// at run time), parallel across and within tensors.
//
// The non-finite test is a running maximum of |bits|: an element is inf/NaN
// iff its magnitude bits are >= the all-ones exponent, and an unsigned max
// vectorises to one instruction per vector (vpmaxud / vpmaxuw).

#include "kernels.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace torchamp {
namespace kernels {
namespace {

constexpr uint32_t kF32ExpMask = 0x7f800000u;
constexpr uint64_t kF64ExpMask = 0x7ff0000000000000ull;

// Elements per parallel work item: large enough to amortise scheduling, small
// enough that 10,000 small tensors still spread over every thread.
constexpr int64_t kGrain = 1 << 15;

inline uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
inline uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
inline float float_of(uint32_t b) {
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// float32 -> bfloat16, round to nearest even, NaN -> 0x7FC0: exactly
// c10::BFloat16's conversion, written branch-free so it vectorises.
inline uint16_t to_bf16(float v) {
  const uint32_t b = bits_of(v);
  const uint32_t rounded = (b + (((b >> 16) & 1u) + 0x7fffu)) >> 16;
  return v != v ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

// Span loops: return whether any input element had an all-ones exponent.

TORCHAMP_TARGET_CLONES
bool unscale_span(float* p, int64_t n, float inv) {
  uint32_t mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = p[i];
    mag = std::max(mag, bits_of(v) & 0x7fffffffu);
    p[i] = v * inv;
  }
  return mag >= kF32ExpMask;
}

TORCHAMP_TARGET_CLONES
bool unscale_span(double* p, int64_t n, float inv) {
  const double dinv = inv;
  uint64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = p[i];
    bad |= static_cast<uint64_t>((bits_of(v) & kF64ExpMask) == kF64ExpMask);
    p[i] = v * dinv;
  }
  return bad != 0;
}

TORCHAMP_TARGET_CLONES
bool unscale_span(uint16_t* p, int64_t n, float inv) {  // bfloat16 bits
  uint32_t mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = static_cast<uint32_t>(p[i]) << 16;
    mag = std::max(mag, b & 0x7fffffffu);
    p[i] = to_bf16(float_of(b) * inv);
  }
  return mag >= kF32ExpMask;
}

// bfloat16 with AVX-512 BF16 (VCVTNEPS2BF16 rounds 16 floats to bfloat16 in one
// instruction), picked at run time where the CPU and OS have it. The
// instruction rounds to nearest even like c10::BFloat16, but it flushes
// subnormal results to zero and keeps a NaN's payload; a vector holding either
// is rounded with the exact integer formula instead (AVX-512F), so the result
// is bit-identical to the portable loop above on every input.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TORCHAMP_X86_BF16 1

bool cpu_has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0 || (b & (1u << 16)) == 0 || a < 1) {
    return false;  // no AVX512F, or no leaf 7 subleaf 1
  }
  __get_cpuid_count(7, 1, &a, &b, &c, &d);
  if ((a & (1u << 5)) == 0) {
    return false;  // no AVX512_BF16
  }
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & (1u << 27)) == 0) {
    return false;  // no OSXSAVE: cannot ask the OS
  }
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6u) == 0xe6u;  // the OS saves SSE, AVX and all AVX-512 state
}

// GCC 12's AVX-512 intrinsics start some vectors from _mm512_undefined_*(),
// which -Wall reports as uninitialised inside its own header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bf16"))) bool unscale_span_avx512_bf16(uint16_t* p, int64_t n,
                                                                            float inv) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i exp_mask = _mm512_set1_epi32(static_cast<int>(kF32ExpMask));
  const __m512i min_normal = _mm512_set1_epi32(0x00800000);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i bf16_nan = _mm512_set1_epi32(0x7fc0);
  __m512i mag = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m512i in = _mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16);
    mag = _mm512_max_epu32(mag, _mm512_and_si512(in, abs_mask));
    const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(in), vinv);
    const __m512i vb = _mm512_castps_si512(v);
    const __m512i va = _mm512_and_si512(vb, abs_mask);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(va, exp_mask);
    const __mmask16 subnormal =
        _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(va, va), va, min_normal);
    __m256i out;
    if ((nan | subnormal) == 0) {
      const __m256bh r = _mm512_cvtneps_pbh(v);
      std::memcpy(&out, &r, sizeof out);
    } else {  // exact: (b + 0x7fff + ((b >> 16) & 1)) >> 16, NaN -> 0x7FC0
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(vb, 16), one);
      __m512i r = _mm512_srli_epi32(_mm512_add_epi32(vb, _mm512_add_epi32(lsb, bias)), 16);
      r = _mm512_mask_mov_epi32(r, nan, bf16_nan);
      out = _mm512_cvtepi32_epi16(r);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + i), out);
  }
  uint32_t m = _mm512_reduce_max_epu32(mag);
  for (; i < n; ++i) {
    const uint32_t b = static_cast<uint32_t>(p[i]) << 16;
    m = std::max(m, b & 0x7fffffffu);
    p[i] = to_bf16(float_of(b) * inv);
  }
  return m >= kF32ExpMask;
}
#pragma GCC diagnostic pop

const bool kHasAvx512Bf16 = cpu_has_avx512_bf16();
#else
const bool kHasAvx512Bf16 = false;
#endif

std::atomic<bool> g_force_portable_bf16{std::getenv("TORCHAMP_PORTABLE_KERNELS") != nullptr};

bool unscale_span_bf16(uint16_t* p, int64_t n, float inv) {
#ifdef TORCHAMP_X86_BF16
  if (kHasAvx512Bf16 && !g_force_portable_bf16.load(std::memory_order_relaxed)) {
    return unscale_span_avx512_bf16(p, n, inv);
  }
#endif
  return unscale_span(p, n, inv);
}

// float16 (for ATen's op only; the GradScaler refuses float16 gradients):
// converted with c10::Half's own routines, so the result is c10::Half's.
bool unscale_half_span(uint16_t* p, int64_t n, float inv) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<uint32_t>((p[i] & 0x7c00u) == 0x7c00u);
    p[i] = c10::detail::fp16_ieee_from_fp32_value(c10::detail::fp16_ieee_to_fp32_value(p[i]) * inv);
  }
  return bad != 0;
}

TORCHAMP_TARGET_CLONES
bool check_half_span(const uint16_t* p, int64_t n) {
  uint16_t mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    mag = std::max(mag, static_cast<uint16_t>(p[i] & 0x7fffu));
  }
  return mag >= 0x7c00u;
}

TORCHAMP_TARGET_CLONES
bool check_span(const float* p, int64_t n) {
  uint32_t mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    mag = std::max(mag, bits_of(p[i]) & 0x7fffffffu);
  }
  return mag >= kF32ExpMask;
}

TORCHAMP_TARGET_CLONES
bool check_span(const double* p, int64_t n) {
  uint64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<uint64_t>((bits_of(p[i]) & kF64ExpMask) == kF64ExpMask);
  }
  return bad != 0;
}

TORCHAMP_TARGET_CLONES
bool check_span(const uint16_t* p, int64_t n) {  // bfloat16 bits
  uint16_t mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    mag = std::max(mag, static_cast<uint16_t>(p[i] & 0x7fffu));
  }
  return mag >= 0x7f80u;
}

struct Segment {
  void* data;
  int64_t numel;
  at::ScalarType dtype;
};

// Process [begin, end) of one segment; returns the non-finite flag.
inline bool run_segment(const Segment& s, int64_t begin, int64_t end, bool write, float inv) {
  const int64_t n = end - begin;
  switch (s.dtype) {
    case at::kFloat: {
      auto* p = static_cast<float*>(s.data) + begin;
      return write ? unscale_span(p, n, inv) : check_span(p, n);
    }
    case at::kDouble: {
      auto* p = static_cast<double*>(s.data) + begin;
      return write ? unscale_span(p, n, inv) : check_span(p, n);
    }
    case at::kBFloat16: {
      auto* p = static_cast<uint16_t*>(s.data) + begin;
      return write ? unscale_span_bf16(p, n, inv) : check_span(p, n);
    }
    case at::kHalf: {
      auto* p = static_cast<uint16_t*>(s.data) + begin;
      return write ? unscale_half_span(p, n, inv) : check_half_span(p, n);
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "unreachable dtype ", s.dtype);
  }
}

bool run(c10::ArrayRef<at::Tensor> tensors, bool write, float inv,
         std::vector<uint8_t>* per_tensor_found) {
  // One small vector per call (a segment per tensor) plus the prefix sums;
  // non-contiguous tensors go through a contiguous copy written back after.
  std::vector<Segment> segments;
  std::vector<int64_t> offsets;  // offsets[i] = first global element of segment i
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  std::vector<size_t> tensor_of;  // segment -> index in `tensors`
  segments.reserve(tensors.size());
  offsets.reserve(tensors.size() + 1);
  tensor_of.reserve(tensors.size());
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_INTERNAL_ASSERT(t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
                          cpu_supports(t.scalar_type()));
    if (t.numel() == 0) {
      continue;
    }
    at::Tensor dense = t;
    if (!t.is_contiguous()) {
      dense = t.contiguous();
      copies.emplace_back(t, dense);  // kept alive for the pass, written back after
    }
    segments.push_back({dense.data_ptr(), dense.numel(), dense.scalar_type()});
    offsets.push_back(total);
    tensor_of.push_back(i);
    total += dense.numel();
  }
  offsets.push_back(total);

  std::unique_ptr<std::atomic<uint8_t>[]> found_per_segment;
  if (per_tensor_found != nullptr) {
    found_per_segment.reset(new std::atomic<uint8_t>[segments.size()]);
    for (size_t s = 0; s < segments.size(); ++s) {
      found_per_segment[s].store(0, std::memory_order_relaxed);
    }
  }
  std::atomic<bool> found{false};

  if (total > 0) {
    at::parallel_for(0, total, kGrain, [&](int64_t begin, int64_t end) {
      // First segment that holds `begin`.
      auto s = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), begin) -
                                   offsets.begin() - 1);
      bool local = false;
      for (int64_t pos = begin; pos < end; ++s) {
        const int64_t seg_end = std::min(end, offsets[s + 1]);
        const bool bad =
            run_segment(segments[s], pos - offsets[s], seg_end - offsets[s], write, inv);
        if (bad) {
          local = true;
          if (found_per_segment) {
            found_per_segment[s].store(1, std::memory_order_relaxed);
          }
        }
        pos = seg_end;
      }
      if (local) {
        found.store(true, std::memory_order_relaxed);
      }
    });
  }

  if (write) {
    for (auto& [original, dense] : copies) {
      original.copy_(dense);
    }
  }
  if (per_tensor_found != nullptr) {
    per_tensor_found->assign(tensors.size(), 0);
    for (size_t s = 0; s < segments.size(); ++s) {
      (*per_tensor_found)[tensor_of[s]] = found_per_segment[s].load(std::memory_order_relaxed);
    }
  }
  return found.load(std::memory_order_relaxed);
}

}  // namespace

bool cpu_supports(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
         dtype == at::kHalf;
}

bool unscale_cpu_(c10::ArrayRef<at::Tensor> tensors, float inv_scale,
                  std::vector<uint8_t>* per_tensor_found) {
  return run(tensors, /*write=*/inv_scale != 1.0f, inv_scale, per_tensor_found);
}

bool check_cpu(c10::ArrayRef<at::Tensor> tensors, std::vector<uint8_t>* per_tensor_found) {
  return run(tensors, /*write=*/false, 1.0f, per_tensor_found);
}

const char* bf16_unscale_path() {
  return kHasAvx512Bf16 && !g_force_portable_bf16.load() ? "avx512-bf16" : "portable";
}

void force_portable_bf16(bool on) {
  g_force_portable_bf16.store(on);
}

}  // namespace kernels
}  // namespace torchamp
