// CPU kernels: one read (and at most one write) per element, vectorised by the
// compiler (this file is built with -O3; the span loops are cloned for AVX2
// and picked at load time; bfloat16 unscaling has an AVX-512 BF16 loop picked
// at run time), parallel across and within tensors.
//
// The non-finite test is a running maximum of |bits|: an element is inf/NaN
// iff its magnitude bits are >= the all-ones exponent, and an unsigned max
// vectorises to one instruction per vector (vpmaxud / vpmaxuw).

#include "kernels.h"
#include "x86_vec.h"

#include "bf16.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

namespace torchamp {
namespace kernels {
namespace {

constexpr uint32_t kF32ExpMask = 0x7f800000u;
constexpr uint64_t kF64ExpMask = 0x7ff0000000000000ull;

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

// bfloat16 two at a time, as the halves of a 32-bit word (little-endian:
// element 2i is the low half): each half becomes a float by a shift or a mask
// and goes back by a shift or a mask, so the loop needs none of the widening,
// packing and lane-crossing shuffles that one element per 32-bit lane costs
// (which made it compute-bound at about half the memory's speed). A half is
// inf/NaN when its exponent bits are all ones: adding 0x0080 to them carries
// into its top bit, which never crosses into the other half.
//
// The rounding is float_to_bf16's without its NaN case: a NaN input times a
// finite scale is a NaN whose low 16 bits are zero (the input's), so the
// rounding adds no carry and gives a NaN; a finite or infinite input gives no
// NaN. So NaNs out are exactly NaNs in, and fix_bf16_nans turns them into
// c10::BFloat16's 0x7FC0 afterwards, only where the check saw an inf/NaN.
// One word: the check's bits, and the two halves unscaled and rounded.
__attribute__((always_inline)) inline uint32_t unscale_bf16_pair(uint32_t x, float inv,
                                                                 uint32_t& bad) {
  bad |= (x & 0x7f807f80u) + 0x00800080u;
  const uint32_t bl = bits_of(float_of(x << 16) * inv);
  const uint32_t bh = bits_of(float_of(x & 0xffff0000u) * inv);
  // Round to nearest even, each half.
  return ((bh + 0x7fffu + ((bh >> 16) & 1u)) & 0xffff0000u) |
         ((bl + 0x7fffu + ((bl >> 16) & 1u)) >> 16);
}

// A cache line of words at a time, asking for the line kPairsPrefetchBytes
// ahead: on one thread over 1 GiB the loop (24 vector instructions per 32
// bytes) kept fewer misses in flight than the plain multiply loop and ran at
// 0.85 of it (bench_unscale --interleaved); 8 KB ahead it ran at 1.02-1.13
// of it (issue #41). Spans shorter than twice that distance, which the
// caches hold or the hardware prefetcher covers, keep the plain loop.
constexpr int64_t kPairsPerLine = 16;
constexpr int64_t kPairsPrefetchBytes = 8192;

TORCHAMP_TARGET_CLONES
bool unscale_bf16_pairs(uint32_t* __restrict w, int64_t n, float inv) {
  uint32_t bad = 0;
  int64_t i = 0;
  if (n >= 2 * kPairsPrefetchBytes / 4) {
    for (; i + kPairsPerLine <= n; i += kPairsPerLine) {
      __builtin_prefetch(w + i + kPairsPrefetchBytes / 4, 1);
      for (int64_t k = i; k < i + kPairsPerLine; ++k) {
        w[k] = unscale_bf16_pair(w[k], inv, bad);
      }
    }
  }
  for (; i < n; ++i) {
    w[i] = unscale_bf16_pair(w[i], inv, bad);
  }
  return (bad & 0x80008000u) != 0;
}

void fix_bf16_nans(uint16_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if ((p[i] & 0x7fffu) > 0x7f80u) {
      p[i] = 0x7fc0u;
    }
  }
}

bool unscale_span(uint16_t* p, int64_t n, float inv) {  // bfloat16 bits
  bool bad = false;
  auto one = [&bad, inv](uint16_t& v) {
    const uint32_t b = static_cast<uint32_t>(v) << 16;
    bad = bad || (b & 0x7fffffffu) >= kF32ExpMask;
    v = float_to_bf16(float_of(b) * inv);
  };
  if (n > 0 && reinterpret_cast<uintptr_t>(p) % alignof(uint32_t) != 0) {
    one(*p++);
    --n;
  }
  const int64_t pairs = n / 2;
  // p is 4-byte aligned here (a bfloat16 tensor's data is at least 2-byte
  // aligned); its words are read only as words in this loop.
  if (unscale_bf16_pairs(reinterpret_cast<uint32_t*>(p), pairs, inv)) {
    fix_bf16_nans(p, 2 * pairs);
    bad = true;
  }
  if (n % 2 != 0) {
    one(p[n - 1]);
  }
  return bad;
}

// bfloat16 with AVX-512 BF16 (VCVTNE2PS2BF16 rounds 32 floats to bfloat16 in
// one instruction), picked at run time where the CPU and OS have it. The
// instruction rounds to nearest even like c10::BFloat16, but it flushes
// subnormal results to zero and keeps a NaN's payload; a vector holding either
// (one VFPCLASSPS each) is rounded with the exact integer formula instead, so
// the result is bit-identical to the portable loop above on every input. 32
// elements per iteration, the last (partial) one masked: no scalar tail, which
// matters for tensors of a few hundred elements. Over 1 GiB on one thread it
// ran at 0.55 of the plain multiply loop until it asked for the line 8 KB
// ahead as the pairs loop does: 1.18 (Xeon with AVX512_BF16, bench_unscale
// --interleaved, 2026-12-02).
#ifdef TORCHAMP_X86_VECTORS
#define TORCHAMP_X86_AVX512 1  // the AVX-512 loops below exist

TORCHAMP_X86_DIAGNOSTICS_PUSH  // the warnings x86_vec.h names
    TORCHAMP_AVX512_BF16 bool
    unscale_span_avx512_bf16(uint16_t* p, int64_t n, float inv) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i abs_mask = _mm512_set1_epi16(0x7fff);
  constexpr int kNanOrSubnormal = 0x01 | 0x20 | 0x80;  // QNaN, denormal, SNaN
  __m512i mag = _mm512_setzero_si512();
  const bool stream = n >= kPairsPrefetchBytes;  // 16 KB or more: as the pairs loop
  for (int64_t i = 0; i < n; i += 32) {
    if (stream) {  // one line per iteration; the one kPairsPrefetchBytes ahead
      __builtin_prefetch(p + i + kPairsPrefetchBytes / 2, 1);
    }
    // Lanes past the end load as +0 and are not stored.
    const __mmask32 live = n - i >= 32 ? ~__mmask32{0} : (__mmask32{1} << (n - i)) - 1;
    const __m512i raw = _mm512_maskz_loadu_epi16(live, p + i);
    mag = _mm512_max_epu16(mag, _mm512_and_si512(raw, abs_mask));
    const __m512i lo32 = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16);
    const __m512i hi32 =
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16);
    const __m512 lo = _mm512_mul_ps(_mm512_castsi512_ps(lo32), vinv);
    const __m512 hi = _mm512_mul_ps(_mm512_castsi512_ps(hi32), vinv);
    __m512i out;
    if ((_mm512_fpclass_ps_mask(lo, kNanOrSubnormal) |
         _mm512_fpclass_ps_mask(hi, kNanOrSubnormal)) == 0) {
      const __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);  // lo -> the lower 16
      std::memcpy(&out, &r, sizeof out);
    } else {
      out = _mm512_inserti64x4(_mm512_castsi256_si512(round_bf16(lo)), round_bf16(hi), 1);
    }
    _mm512_mask_storeu_epi16(p + i, live, out);
  }
  return _mm512_cmpge_epu16_mask(mag, _mm512_set1_epi16(0x7f80)) != 0;
}
// float32: the same loop as the portable one, 16 lanes wide, its last
// (partial) vector masked. What it buys is the tail: a 100-element gradient
// is 6 full vectors and one masked one instead of 12 AVX2 vectors and 4
// scalar iterations. Multiplication is IEEE either way: identical bits.
__attribute__((target("avx512f"))) bool unscale_span_avx512(float* p, int64_t n, float inv) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  __m512i mag = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 live = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(live, p + i);
    mag = _mm512_max_epu32(mag, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
    _mm512_mask_storeu_ps(p + i, live, _mm512_mul_ps(v, vinv));
  }
  return _mm512_reduce_max_epu32(mag) >= kF32ExpMask;
}
TORCHAMP_X86_DIAGNOSTICS_POP

#endif

bool use_avx512(bool have) {
  return have && isa_cap() >= Isa::avx512;
}

bool unscale_span_f32(float* p, int64_t n, float inv) {
#ifdef TORCHAMP_X86_AVX512
  if (use_avx512(cpu_features().avx512)) {
    return unscale_span_avx512(p, n, inv);
  }
#endif
  return unscale_span(p, n, inv);
}

bool unscale_span_bf16(uint16_t* p, int64_t n, float inv) {
#ifdef TORCHAMP_X86_AVX512
  if (use_avx512(cpu_features().avx512_bf16)) {
    return unscale_span_avx512_bf16(p, n, inv);
  }
#endif
  return unscale_span(p, n, inv);
}

// float16 (ATen's op, and the Paddle facade's unscale; the GradScaler itself
// refuses float16 gradients): converted exactly as c10::Half (bf16.h).
TORCHAMP_TARGET_CLONES
bool unscale_half_span(uint16_t* p, int64_t n, float inv) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad |= static_cast<uint32_t>((p[i] & 0x7c00u) == 0x7c00u);
    p[i] = float_to_f16(f16_to_float(p[i]) * inv);
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

// Sum of squares of n elements (in double), and whether any is inf/NaN.
// Eight independent accumulators so that the loop vectorises without
// reassociating a single sum.
template <class Load>
__attribute__((always_inline)) inline bool sum_squares_loop(int64_t n, double* out, Load load) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const double v = load(i + k);
      acc[k] += v * v;
    }
  }
  for (; i < n; ++i) {
    const double v = load(i);
    acc[0] += v * v;
  }
  double total = 0;
  for (int k = 0; k < kLanes; ++k) {
    total += acc[k];
  }
  // inf/NaN anywhere makes the sum inf/NaN, and a block of finite elements
  // (each square below 1.2e77) cannot overflow double.
  *out = total;
  return !std::isfinite(total);
}

TORCHAMP_TARGET_CLONES
bool sum_squares_span(const float* p, int64_t n, double* out) {
  return sum_squares_loop(n, out, [p](int64_t i) { return static_cast<double>(p[i]); });
}
TORCHAMP_TARGET_CLONES
bool sum_squares_span(const double* p, int64_t n, double* out) {
  return sum_squares_loop(n, out, [p](int64_t i) { return p[i]; });
}
TORCHAMP_TARGET_CLONES
bool sum_squares_bf16_span(const uint16_t* p, int64_t n, double* out) {
  return sum_squares_loop(n, out,
                          [p](int64_t i) { return static_cast<double>(bf16_to_float(p[i])); });
}
TORCHAMP_TARGET_CLONES
bool sum_squares_half_span(const uint16_t* p, int64_t n, double* out) {
  return sum_squares_loop(n, out,
                          [p](int64_t i) { return static_cast<double>(f16_to_float(p[i])); });
}

bool sum_squares_of(const SpanList::Span& s, int64_t begin, int64_t end, double* out) {
  const int64_t n = end - begin;
  switch (s.dtype) {
    case at::kFloat:
      return sum_squares_span(static_cast<const float*>(s.data) + begin, n, out);
    case at::kDouble:
      return sum_squares_span(static_cast<const double*>(s.data) + begin, n, out);
    case at::kBFloat16:
      return sum_squares_bf16_span(static_cast<const uint16_t*>(s.data) + begin, n, out);
    case at::kHalf:
      return sum_squares_half_span(static_cast<const uint16_t*>(s.data) + begin, n, out);
    default:
      TORCH_INTERNAL_ASSERT(false, "unreachable dtype ", s.dtype);
  }
}

// Process [begin, end) of one span; returns the non-finite flag.
inline bool run_span(const SpanList::Span& s, int64_t begin, int64_t end, bool write, float inv) {
  const int64_t n = end - begin;
  switch (s.dtype) {
    case at::kFloat: {
      auto* p = static_cast<float*>(s.data) + begin;
      return write ? unscale_span_f32(p, n, inv) : check_span(p, n);
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
  // Non-contiguous tensors go through a contiguous copy written back after.
  SpanList spans;
  spans.reserve(tensors.size());
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  std::vector<size_t> tensor_of;  // span -> index in `tensors`
  tensor_of.reserve(tensors.size());
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
    spans.add(dense.data_ptr(), dense.numel(), dense.scalar_type());
    tensor_of.push_back(i);
  }
  const bool found = spans.run(write, inv);
  if (write) {
    for (auto& [original, dense] : copies) {
      original.copy_(dense);
    }
  }
  if (per_tensor_found != nullptr) {
    per_tensor_found->assign(tensors.size(), 0);
    for (size_t s = 0; s < spans.size(); ++s) {
      (*per_tensor_found)[tensor_of[s]] = spans.found(s);
    }
  }
  return found;
}

}  // namespace

void SpanList::clear() {
  spans_.clear();
  offsets_.assign(1, 0);
}

void SpanList::reserve(size_t n) {
  spans_.reserve(n);
  offsets_.reserve(n + 1);
}

void SpanList::add(void* data, int64_t numel, at::ScalarType dtype) {
  TORCH_INTERNAL_ASSERT(numel > 0 && data != nullptr && cpu_supports(dtype));
  spans_.push_back({data, numel, dtype});
  offsets_.push_back(offsets_.back() + numel);
}

void SpanList::reset_found() {
  if (found_.size() != spans_.size()) {
    found_ = std::vector<std::atomic<uint8_t>>(spans_.size());
  } else if (any_found_) {  // flags are only ever set to 1: clear them once used
    for (auto& f : found_) {
      f.store(0, std::memory_order_relaxed);
    }
  }
  any_found_ = false;
}

bool SpanList::run(bool write, float inv) {
  reset_found();
  if (total_elements() == 0) {
    return false;
  }
  std::atomic<bool> any{false};
  for_each_piece(offsets_, [&](size_t s, int64_t begin, int64_t end) {
    if (run_span(spans_[s], begin, end, write, inv)) {
      found_[s].store(1, std::memory_order_relaxed);
      any.store(true, std::memory_order_relaxed);
    }
  });
  any_found_ = any.load(std::memory_order_relaxed);
  return any_found_;
}

bool SpanList::check_sum_squares(double* sum_squares) {
  reset_found();
  // Fixed blocks: span s's block b covers [b * kGrain, min((b + 1) * kGrain, numel)).
  std::vector<int64_t> first_block(spans_.size() + 1, 0);
  for (size_t s = 0; s < spans_.size(); ++s) {
    first_block[s + 1] = first_block[s] + (spans_[s].numel + kGrain - 1) / kGrain;
  }
  std::vector<double> sums(static_cast<size_t>(first_block.back()), 0.0);
  at::parallel_for(0, first_block.back(), 1, [&](int64_t begin, int64_t end) {
    auto s = static_cast<size_t>(std::upper_bound(first_block.begin(), first_block.end(), begin) -
                                 first_block.begin() - 1);
    for (int64_t b = begin; b < end; ++b) {
      while (b >= first_block[s + 1]) {
        ++s;
      }
      const int64_t lo = (b - first_block[s]) * kGrain;
      const int64_t hi = std::min(lo + kGrain, spans_[s].numel);
      if (sum_squares_of(spans_[s], lo, hi, &sums[static_cast<size_t>(b)])) {
        found_[s].store(1, std::memory_order_relaxed);
      }
    }
  });
  double total = 0;
  for (double v : sums) {
    total += v;
  }
  *sum_squares = total;
  any_found_ = !std::isfinite(total);
  return any_found_;
}

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

const char* unscale_path(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return use_avx512(cpu_features().avx512) ? "avx512" : "portable";
    case at::kBFloat16:
      return use_avx512(cpu_features().avx512_bf16) ? "avx512-bf16" : "portable";
    default:
      return "portable";
  }
}

}  // namespace kernels
}  // namespace torchamp
