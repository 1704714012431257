#pragma once

// The kernels' x86 vector layer: the instruction sets the optimizer loops
// are written over (Avx2: 8 lanes; Avx512: 16, masked tails), their vector
// types and c10's float16/bfloat16 conversions on them, and the bfloat16
// rounding the AVX-512 unscale loop shares. Everything here is inline and
// in an unnamed namespace: each kernel file compiles its own copy under its
// own flags (optim_cpu.cpp's -ffp-contract=off must not meet another file's
// copy at link time).

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TORCHAMP_X86_VECTORS 1  // the layer exists on this target

#include "bf16.h"  // kNoiseMultiplier

#include <immintrin.h>

#include <cstdint>

#define TORCHAMP_AVX2 __attribute__((target("avx2,f16c")))
#define TORCHAMP_AVX512 __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#define TORCHAMP_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16")))
#define TORCHAMP_INLINE __attribute__((always_inline)) inline

// Around code on these vectors, here and in the kernel files: GCC 12's
// AVX-512 intrinsics start some vectors from _mm512_undefined_*(), which
// -Wall reports as uninitialised inside its own header; the helpers pass
// vectors without a target of their own, always inlined (-Wpsabi).
#if defined(__GNUC__) && !defined(__clang__)
#define TORCHAMP_X86_GCC_IGNORES                              \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#else
#define TORCHAMP_X86_GCC_IGNORES
#endif
#define TORCHAMP_X86_DIAGNOSTICS_PUSH                                                  \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      TORCHAMP_X86_GCC_IGNORES
#define TORCHAMP_X86_DIAGNOSTICS_POP _Pragma("GCC diagnostic pop")

TORCHAMP_X86_DIAGNOSTICS_PUSH

namespace torchamp {
namespace kernels {
namespace {

// c10::BFloat16's rounding of 16 floats: (b + 0x7fff + ((b >> 16) & 1)) >> 16,
// NaN -> 0x7FC0 (AVX-512F alone, so that every AVX-512 loop can inline it).
__attribute__((target("avx512f"))) inline __m256i round_bf16(__m512 v) {
  const __m512i vb = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(vb, 16), _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(vb, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(r);
}

// An instruction set, as the walk below uses it:
//   V, H           kWidth floats; kWidth 16-bit values;
//   V's operators  +, *, /, maximum, sqrt_of: each one IEEE operation, as
//                  the scalar ones;
//   splat(x)       x rounded to float (exactly for a float) and broadcast;
//   {widen,narrow}_{f16,bf16}  c10::Half's and c10::BFloat16's conversions;
//   join_bf16(p, r), split_bf16(x, p, r)  a bfloat16 master's float32 bits
//                  from and to its parameter and remainder (Bf16Master);
//   N, lanes_from(i), noise32(n, key), low16(n), high16(n)
//                  kWidth uint32 lanes: i, i + 1, ...; bf16.h's noise32 on each;
//   narrow_bf16_stochastic(x, n)  float_to_bf16_stochastic on each lane;
//   All, tail_lanes(n)  where an iteration loads and stores: every lane, or
//                  a job's last n < kWidth elements, starting at
//                  tail_start(i, e); kMasked: a job of any length can be
//                  walked (else shorter than kWidth takes the one-pass loop).

// +, *, / and sqrt_of on a vector type V of `PREFIX`_*_ps (__m256 or __m512).
#define TORCHAMP_VEC_ARITHMETIC(V, TARGET, PREFIX) \
  TARGET inline V operator+(V a, V b) {            \
    return {PREFIX##_add_ps(a.v, b.v)};            \
  }                                                \
  TARGET inline V operator*(V a, V b) {            \
    return {PREFIX##_mul_ps(a.v, b.v)};            \
  }                                                \
  TARGET inline V operator/(V a, V b) {            \
    return {PREFIX##_div_ps(a.v, b.v)};            \
  }                                                \
  TARGET inline V sqrt_of(V a) {                   \
    return {PREFIX##_sqrt_ps(a.v)};                \
  }

// AVX2 + F16C: 8 lanes.
struct V8 {
  __m256 v;
};
TORCHAMP_VEC_ARITHMETIC(V8, TORCHAMP_AVX2, _mm256)
// std::max(a, b): a unless a < b (so a where either is NaN).
TORCHAMP_AVX2 inline V8 maximum(V8 a, V8 b) {
  return {_mm256_blendv_ps(a.v, b.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))};
}

struct N8 {
  __m256i v;
};

struct Avx2 {
  using V = V8;
  using H = __m128i;
  using N = N8;
  static constexpr int64_t kWidth = 8;
  static constexpr bool kMasked = false;

  TORCHAMP_AVX2 static V splat(double x) { return {_mm256_set1_ps(static_cast<float>(x))}; }
  // The low 16 bits of each 32-bit lane (each at most 0xFFFF), packed.
  TORCHAMP_AVX2 static H pack(__m256i x) {
    return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  }
  // VCVTPH2PS is exact and keeps a NaN's payload, quiet: f16_to_float (and
  // c10::Half) to the bit. (A signalling NaN kept signalling would show: an
  // SGD momentum buffer's first value is the gradient itself.)
  TORCHAMP_AVX2 static V widen_f16(H h) { return {_mm256_cvtph_ps(h)}; }
  // VCVTPS2PH rounds to nearest even as float_to_f16 does, subnormals and
  // overflow to inf included, but keeps a NaN's payload; float_to_f16 gives
  // sign | 0x7E00.
  TORCHAMP_AVX2 static H narrow_f16(V x) {
    const __m256 f = x.v;
    H h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(nan) != 0) {
      const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(f), 16),
                                            _mm256_set1_epi32(0x8000));
      h = pack(_mm256_blendv_epi8(_mm256_cvtepu16_epi32(h),
                                  _mm256_or_si256(sign, _mm256_set1_epi32(0x7e00)),
                                  _mm256_castps_si256(nan)));
    }
    return h;
  }
  TORCHAMP_AVX2 static V widen_bf16(H h) {  // bf16_to_float
    return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))};
  }
  // float_to_bf16: (b + 0x7FFF + ((b >> 16) & 1)) >> 16, NaN -> 0x7FC0.
  TORCHAMP_AVX2 static H narrow_bf16(V x) {
    const __m256i b = _mm256_castps_si256(x.v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256 nan = _mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q);
    return pack(_mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan)));
  }
  TORCHAMP_AVX2 static N lanes_from(int64_t i) {
    return {_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))),
                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))};
  }
  TORCHAMP_AVX2 static N noise32(N n, uint32_t key) {
    const __m256i x =
        _mm256_mullo_epi32(_mm256_xor_si256(n.v, _mm256_set1_epi32(static_cast<int>(key))),
                           _mm256_set1_epi32(static_cast<int>(kNoiseMultiplier)));
    return {_mm256_xor_si256(x, _mm256_srli_epi32(x, 16))};
  }
  TORCHAMP_AVX2 static N low16(N n) { return {_mm256_and_si256(n.v, _mm256_set1_epi32(0xffff))}; }
  TORCHAMP_AVX2 static N high16(N n) { return {_mm256_srli_epi32(n.v, 16)}; }
  // float_to_bf16_stochastic: (b + noise) >> 16, NaN -> 0x7FC0 (`noise` at
  // most 0xFFFF; below NaN's bits the sum stays under 2^32).
  TORCHAMP_AVX2 static H narrow_bf16_stochastic(V x, N noise) {
    const __m256i b = _mm256_castps_si256(x.v);
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, noise.v), 16);
    const __m256 nan = _mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q);
    return pack(_mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(nan)));
  }
  TORCHAMP_AVX2 static V join_bf16(H p, H r) {
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(p), 16);
    return {_mm256_castsi256_ps(_mm256_add_epi32(hi, _mm256_cvtepi16_epi32(r)))};
  }
  TORCHAMP_AVX2 static void split_bf16(V x, H& p, H& r) {
    const __m256i b = _mm256_castps_si256(x.v);
    p = pack(_mm256_srli_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x8000)), 16));
    r = pack(_mm256_and_si256(b, _mm256_set1_epi32(0xffff)));
  }

  struct All {
    TORCHAMP_AVX2 V loadf(const float* p) const { return {_mm256_loadu_ps(p)}; }
    TORCHAMP_AVX2 H loadh(const void* p) const {
      return _mm_loadu_si128(static_cast<const __m128i*>(p));
    }
    TORCHAMP_AVX2 void storef(float* p, V x) const { _mm256_storeu_ps(p, x.v); }
    TORCHAMP_AVX2 void storeh(void* p, H x) const { _mm_storeu_si128(static_cast<__m128i*>(p), x); }
  };
  // A job's last n < 8 elements: the 8 ending at e, of which only the last n
  // lanes are stored; the others, elements this call has already updated,
  // are stored back as they are in memory. So the tail takes the same vector
  // loop, in one iteration, instead of a second call and a scalar loop's
  // set-up (4% of a step on tensors of a hundred elements).
  struct Last : All {
    __m256 live32;
    __m128i live16;
    TORCHAMP_AVX2 explicit Last(int64_t n) {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i live = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(static_cast<int>(7 - n)));
      live32 = _mm256_castsi256_ps(live);
      live16 = _mm_packs_epi32(_mm256_castsi256_si128(live), _mm256_extracti128_si256(live, 1));
    }
    TORCHAMP_AVX2 void storef(float* p, V x) const {
      _mm256_storeu_ps(p, _mm256_blendv_ps(_mm256_loadu_ps(p), x.v, live32));
    }
    TORCHAMP_AVX2 void storeh(void* p, H x) const {
      auto* q = static_cast<__m128i*>(p);
      _mm_storeu_si128(q, _mm_blendv_epi8(_mm_loadu_si128(q), x, live16));
    }
  };
  static int64_t tail_start(int64_t /*i*/, int64_t e) { return e - kWidth; }
  TORCHAMP_AVX2 static Last tail_lanes(int64_t n) { return Last(n); }
};

// AVX-512 (F, BW, DQ, VL): 16 lanes, and a job's last n < 16 elements in one
// masked iteration (masked-off lanes are neither read nor written).
struct V16 {
  __m512 v;
};
TORCHAMP_VEC_ARITHMETIC(V16, TORCHAMP_AVX512, _mm512)
TORCHAMP_AVX512 inline V16 maximum(V16 a, V16 b) {  // as V8's
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ), a.v, b.v)};
}

// 16 16-bit values (a struct, as V16: the walk's helpers pass them without
// an AVX target of their own, which clang refuses for a bare __m256i).
struct H16 {
  __m256i v;
};

struct N16 {
  __m512i v;
};

struct Avx512 {
  using V = V16;
  using H = H16;
  using N = N16;
  static constexpr int64_t kWidth = 16;
  static constexpr bool kMasked = true;

  TORCHAMP_AVX512 static V splat(double x) { return {_mm512_set1_ps(static_cast<float>(x))}; }
  TORCHAMP_AVX512 static V widen_f16(H h) { return {_mm512_cvtph_ps(h.v)}; }  // as Avx2's
  TORCHAMP_AVX512 static H narrow_f16(V x) {                                  // as Avx2's
    __m256i h = _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q);
    if (nan != 0) {
      const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x.v), 16),
                                            _mm512_set1_epi32(0x8000));
      h = _mm256_mask_blend_epi16(
          nan, h, _mm512_cvtepi32_epi16(_mm512_or_si512(sign, _mm512_set1_epi32(0x7e00))));
    }
    return {h};
  }
  TORCHAMP_AVX512 static V widen_bf16(H h) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h.v), 16))};
  }
  TORCHAMP_AVX512 static H narrow_bf16(V x) { return {round_bf16(x.v)}; }  // as Avx2's
  TORCHAMP_AVX512 static N lanes_from(int64_t i) {                         // as Avx2's
    return {
        _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))};
  }
  TORCHAMP_AVX512 static N noise32(N n, uint32_t key) {  // as Avx2's
    const __m512i x =
        _mm512_mullo_epi32(_mm512_xor_si512(n.v, _mm512_set1_epi32(static_cast<int>(key))),
                           _mm512_set1_epi32(static_cast<int>(kNoiseMultiplier)));
    return {_mm512_xor_si512(x, _mm512_srli_epi32(x, 16))};
  }
  TORCHAMP_AVX512 static N low16(N n) { return {_mm512_and_si512(n.v, _mm512_set1_epi32(0xffff))}; }
  TORCHAMP_AVX512 static N high16(N n) { return {_mm512_srli_epi32(n.v, 16)}; }
  TORCHAMP_AVX512 static H narrow_bf16_stochastic(V x, N noise) {  // as Avx2's
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_castps_si512(x.v), noise.v), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q),
                              _mm512_set1_epi32(0x7fc0));
    return {_mm512_cvtepi32_epi16(r)};
  }
  TORCHAMP_AVX512 static V join_bf16(H p, H r) {
    const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(p.v), 16);
    return {_mm512_castsi512_ps(_mm512_add_epi32(hi, _mm512_cvtepi16_epi32(r.v)))};
  }
  // VPMOVDW keeps each lane's low 16 bits: the modulo-2^16 halves.
  TORCHAMP_AVX512 static void split_bf16(V x, H& p, H& r) {
    const __m512i b = _mm512_castps_si512(x.v);
    p.v = _mm512_cvtepi32_epi16(
        _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x8000)), 16));
    r.v = _mm512_cvtepi32_epi16(b);
  }

  struct All {
    TORCHAMP_AVX512 V loadf(const float* p) const { return {_mm512_loadu_ps(p)}; }
    TORCHAMP_AVX512 H loadh(const void* p) const {
      return {_mm256_loadu_si256(static_cast<const __m256i*>(p))};
    }
    TORCHAMP_AVX512 void storef(float* p, V x) const { _mm512_storeu_ps(p, x.v); }
    TORCHAMP_AVX512 void storeh(void* p, H x) const {
      _mm256_storeu_si256(static_cast<__m256i*>(p), x.v);
    }
  };
  struct Masked {
    __mmask16 k;
    TORCHAMP_AVX512 V loadf(const float* p) const { return {_mm512_maskz_loadu_ps(k, p)}; }
    TORCHAMP_AVX512 H loadh(const void* p) const { return {_mm256_maskz_loadu_epi16(k, p)}; }
    TORCHAMP_AVX512 void storef(float* p, V x) const { _mm512_mask_storeu_ps(p, k, x.v); }
    TORCHAMP_AVX512 void storeh(void* p, H x) const { _mm256_mask_storeu_epi16(p, k, x.v); }
  };
  static int64_t tail_start(int64_t i, int64_t /*e*/) { return i; }
  static Masked tail_lanes(int64_t n) { return {static_cast<__mmask16>((1u << n) - 1)}; }
};

#undef TORCHAMP_VEC_ARITHMETIC

}  // namespace
}  // namespace kernels
}  // namespace torchamp

TORCHAMP_X86_DIAGNOSTICS_POP
#endif
