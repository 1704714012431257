// What the CPU and the OS offer the kernels, read once per process with
// CPUID and XGETBV (the instruction set must be there and the OS must save
// its registers), and the cap that tests, benchmarks and
// TORCHAMP_PORTABLE_KERNELS put on it. Every kernel file's run-time dispatch
// asks here; none reads CPUID itself.

#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define TORCHAMP_X86_CPUID 1
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define TORCHAMP_ARM_HWCAP 1
#endif

namespace torchamp {
namespace kernels {
namespace {

CpuFeatures detect() {
  CpuFeatures out;
#ifdef TORCHAMP_X86_CPUID
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) {
    return out;
  }
  constexpr unsigned kOsxsave = 1u << 27, kAvx = 1u << 28, kF16c = 1u << 29;
  if ((c & (kOsxsave | kAvx | kF16c)) != (kOsxsave | kAvx | kF16c)) {
    return out;  // no F16C, or no AVX, or no way to ask the OS
  }
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6u) != 0x6u || __get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) {
    return out;  // the OS does not save the SSE and AVX registers
  }
  const unsigned max_subleaf = a;
  out.avx2_f16c = (b & (1u << 5)) != 0;
  constexpr unsigned kF = 1u << 16, kDq = 1u << 17, kBw = 1u << 30, kVl = 1u << 31;
  const bool zmm_saved = (lo & 0xe6u) == 0xe6u;  // and the opmask and ZMM registers
  out.avx512 = out.avx2_f16c && zmm_saved && (b & (kF | kDq | kBw | kVl)) == (kF | kDq | kBw | kVl);
  if (out.avx512) {
    out.avx512_fp16 = (d & (1u << 23)) != 0;
    // AMX: the tile instructions, and the OS saving the tile state (XCR0 17, 18).
    const bool amx = (d & (1u << 24)) != 0 && (lo & 0x60000u) == 0x60000u;
    out.amx_bf16 = amx && (d & (1u << 22)) != 0;
    if (max_subleaf >= 1) {
      __get_cpuid_count(7, 1, &a, &b, &c, &d);
      out.avx512_bf16 = (a & (1u << 5)) != 0;
      out.amx_fp16 = amx && (a & (1u << 21)) != 0;
    }
  }
#endif
#ifdef TORCHAMP_ARM_HWCAP
  out.arm_fp16 = (getauxval(AT_HWCAP) & (1ul << 10)) != 0;   // HWCAP_ASIMDHP
  out.arm_bf16 = (getauxval(AT_HWCAP2) & (1ul << 14)) != 0;  // HWCAP2_BF16
#endif
  return out;
}

// No cap: the last enumerator of Isa.
constexpr Isa kNoCap = Isa::avx512;

// The cap, read from the environment on first use (not at static
// initialisation, which another file's initialiser might precede).
std::atomic<Isa>& cap() {
  static std::atomic<Isa> c{std::getenv("TORCHAMP_PORTABLE_KERNELS") != nullptr ? Isa::portable
                                                                                : kNoCap};
  return c;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

void cap_isa(Isa isa) {
  cap().store(isa);
}

Isa isa_cap() {
  return cap().load(std::memory_order_relaxed);
}

Isa vector_isa() {
  const CpuFeatures& f = cpu_features();
  const Isa have = f.avx512 ? Isa::avx512 : f.avx2_f16c ? Isa::avx2 : Isa::portable;
  return std::min(have, isa_cap());
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2-f16c";
    default:
      return "portable";
  }
}

void force_portable(bool on) {
  cap_isa(on ? Isa::portable : kNoCap);
}

}  // namespace kernels
}  // namespace torchamp
