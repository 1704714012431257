#pragma once

// Bit-level helpers shared by the CPU kernels (not installed): float bits, and
// bfloat16 <-> float32 written branch-free so that loops using them vectorise.

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

}  // namespace kernels
}  // namespace torchamp
