#pragma once

// Bit-level helpers shared by the CPU kernels (not installed): float bits, and
// bfloat16 and float16 <-> float32 written branch-free so that loops using
// them vectorise.

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace torchamp {
namespace kernels {

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

/// bfloat16 bits -> float32 (exact).
inline float bf16_to_float(uint16_t b) {
  return float_of(static_cast<uint32_t>(b) << 16);
}

/// float32 -> bfloat16, round to nearest even, NaN -> 0x7FC0: exactly
/// c10::BFloat16's conversion.
inline uint16_t float_to_bf16(float v) {
  const uint32_t b = bits_of(v);
  const uint32_t rounded = (b + (((b >> 16) & 1u) + 0x7fffu)) >> 16;
  return v != v ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

/// float32 -> bfloat16 with stochastic rounding: `v` rounds away from zero
/// (to the neighbour of larger magnitude) with probability (its low 16 bits)
/// / 65536, else toward zero, so that over uniform `noise` (16 bits) the mean
/// of the result is exactly `v`. Infinities stay, NaN -> 0x7FC0 as
/// float_to_bf16; a value beyond bfloat16's largest finite one may round to
/// infinity (its neighbour above).
inline uint16_t float_to_bf16_stochastic(float v, uint32_t noise) {
  const uint32_t rounded = (bits_of(v) + (noise & 0xffffu)) >> 16;
  return v != v ? uint16_t{0x7fc0} : static_cast<uint16_t>(rounded);
}

/// The stochastic rounding's 32 bits of noise for element `i` under a
/// 32-bit `key` (a hash of seed, update and parameter): a bijection of
/// i ^ key (Fibonacci hashing's multiply, the high half folded into the
/// low). As the key is uniform and changes every update, each element's
/// noise is uniform and independent from one update to the next whatever
/// the bijection; one multiply keeps the vector loops memory-bound.
constexpr uint32_t kNoiseMultiplier = 0x9e3779b1u;
inline uint32_t noise32(uint32_t i, uint32_t key) {
  const uint32_t x = (i ^ key) * kNoiseMultiplier;
  return x ^ (x >> 16);
}

/// float16 bits -> float32, exactly c10::Half's conversion: exact, and a
/// NaN keeps its payload and comes out quiet (c10's multiply sets a
/// signalling NaN's top mantissa bit, as F16C's VCVTPH2PS does). Branch-free
/// (selects), so that loops using it vectorise: c10::Half's own conversion
/// does not in GCC 12 ("control flow in loop").
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  // Normal, inf, NaN: rebias the exponent by 127 - 15 (twice for the
  // all-ones exponent, which becomes float32's all-ones); a NaN made quiet.
  const uint32_t normal = ((em << 13) + 0x38000000u + (em >= 0x7c00u ? 0x38000000u : 0u)) |
                          (em > 0x7c00u ? 0x00400000u : 0u);
  // Zero and subnormal: em units of 2^-24, exact in float32.
  const uint32_t subnormal = bits_of(static_cast<float>(static_cast<int32_t>(em)) * 0x1p-24f);
  return float_of(sign | (em < 0x400u ? subnormal : normal));
}

/// float32 -> float16, round to nearest even, NaN -> sign | 0x7E00: exactly
/// c10::Half's conversion, branch-free.
inline uint16_t float_to_f16(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  // Normal float16: rebias, round the 13 dropped bits to nearest even (a
  // carry moves into the exponent, up to inf at 65520 and above).
  const uint32_t normal = std::min((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13, 0x7c00u);
  // Below 2^-14: adding 0.5 (whose ulp is 2^-24, float16's subnormal step)
  // rounds to nearest even in float32's own adder; the bits above 0.5's count
  // the steps.
  const uint32_t subnormal = bits_of(float_of(a) + 0.5f) - 0x3f000000u;
  const uint32_t magnitude = a > 0x7f800000u ? 0x7e00u : (a < 0x38800000u ? subnormal : normal);
  return static_cast<uint16_t>(sign | magnitude);
}

}  // namespace kernels
}  // namespace torchamp
