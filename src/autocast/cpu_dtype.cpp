#include "autocast/cpu_dtype.h"

#include <torchamp/autocast.h>

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>

namespace torchamp {
namespace {

struct WarningState {
  std::atomic<bool> enabled{std::getenv("TORCHAMP_NO_SLOW_CPU_WARNING") == nullptr};
  std::atomic<bool> given_bf16{false};
  std::atomic<bool> given_fp16{false};
};

// Read on first use, not at static initialisation.
WarningState& warning_state() {
  static WarningState state;
  return state;
}

}  // namespace

namespace detail {

bool cpu_has_fast(at::ScalarType dtype, const kernels::CpuFeatures& f) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
      return true;
    case at::kBFloat16:
      return f.avx512_bf16 || f.amx_bf16 || f.arm_bf16;
    case at::kHalf:
      return f.avx512_fp16 || f.amx_fp16 || f.arm_fp16;
    default:
      TORCH_CHECK_VALUE(false, "cpu_has_fast: dtype ", dtype,
                        " is not a floating-point type a matmul runs in (float32, float64, "
                        "bfloat16 or float16)");
  }
}

std::string slow_cpu_warning(at::ScalarType dtype, const char* what) {
  const bool bf16 = dtype == at::kBFloat16;
  const char* name = bf16 ? "bfloat16" : "float16";
  return std::string("torchamp: ") + what + " puts CPU matmuls in " + name +
         ", but this CPU has no native " + name + " matrix instructions (" +
         (bf16 ? "AVX-512 BF16 or AMX-BF16 on x86, BF16 on Arm"
               : "AVX-512 FP16 or AMX-FP16 on x86, FP16 arithmetic on Arm") +
         "). ATen's " + name +
         " matmuls can run many times slower than float32's here (a GPT training step "
         "measured 12x slower on an AVX2-only CPU), though memory still shrinks (25-30% "
         "less peak there): float32 is likely the faster choice on this machine. "
         "torchamp::cpu_has_fast(dtype) asks; torchamp::set_slow_cpu_warning(false) or "
         "TORCHAMP_NO_SLOW_CPU_WARNING=1 silences this warning.";
}

void warn_if_slow_on_cpu(at::ScalarType dtype, const char* what) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    return;
  }
  WarningState& state = warning_state();
  std::atomic<bool>& given = dtype == at::kBFloat16 ? state.given_bf16 : state.given_fp16;
  if (!state.enabled.load(std::memory_order_relaxed) || given.load(std::memory_order_relaxed) ||
      torchamp::cpu_has_fast(dtype) || given.exchange(true)) {
    return;
  }
  TORCH_WARN(slow_cpu_warning(dtype, what));
}

}  // namespace detail

bool cpu_has_fast(at::ScalarType dtype) {
  return detail::cpu_has_fast(dtype, kernels::cpu_features());
}

void set_slow_cpu_warning(bool enabled) {
  WarningState& state = warning_state();
  if (enabled) {
    state.given_bf16.store(false);
    state.given_fp16.store(false);
  }
  state.enabled.store(enabled);
}

}  // namespace torchamp
