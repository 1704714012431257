#pragma once

/// \file
/// `torchamp::autocast`: an RAII guard over ATen's autocast state, the C++
/// counterpart of Python's `torch.autocast(device_type, dtype, enabled,
/// cache_enabled)`, with one API over LibTorch 1.13 and 2.x.

#include <torchamp/config.h>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace torchamp {

/// From construction until `exit()` (or the end of its scope), ops on the
/// guard's device type run under ATen's autocast policy in `dtype` (matmuls,
/// convolutions and linear layers in half precision; the ops ATen lists as
/// float32-only stay float32).
///
/// ```
/// torchamp::autocast guard(device);          // Python: with torch.autocast(...):
/// auto out = model->forward(x);
/// guard.exit();                              // Python: the end of the with block
/// auto loss = torch::mse_loss(out.to(torch::kFloat), y);
/// ```
///
/// Python's `torch.autocast(device_type, dtype, enabled, cache_enabled)`:
/// float16 on CUDA, bfloat16 on CPU by default. Guards nest and restore what
/// they changed; state is per thread. `c10::ValueError`, changing nothing,
/// for a device type or dtype this LibTorch cannot autocast (Python warns).
/// `[[nodiscard]]`: a discarded temporary would autocast nothing. In full:
/// docs/api.md#autocast.
class autocast {
 public:
  [[nodiscard]] explicit autocast(c10::DeviceType device_type,
                                  std::optional<at::ScalarType> dtype = std::nullopt,
                                  bool enabled = true,
                                  std::optional<bool> cache_enabled = std::nullopt);
  [[nodiscard]] explicit autocast(c10::Device device,
                                  std::optional<at::ScalarType> dtype = std::nullopt,
                                  bool enabled = true,
                                  std::optional<bool> cache_enabled = std::nullopt);
  /// The flag-only form, Python's `torch.autocast(device_type, enabled=use_amp)`.
  [[nodiscard]] autocast(c10::DeviceType device_type, bool enabled);
  [[nodiscard]] autocast(c10::Device device, bool enabled);
  ~autocast();

  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;
  autocast(autocast&&) = delete;
  autocast& operator=(autocast&&) = delete;

  /// Ends the guard now, as leaving Python's `with` block does; a second call
  /// does nothing. `c10::Error`, changing nothing, while a guard made after
  /// this one in this thread is still active.
  void exit();

  /// Whether the guard is still in effect: constructed and not yet exited.
  bool is_active() const { return active_; }

  /// Whether the linked LibTorch can autocast to `dtype` on `device_type`.
  static bool is_supported(c10::DeviceType device_type, at::ScalarType dtype);

  /// The dtype used when none is given: float16 on CUDA, bfloat16 on CPU.
  /// Throws `c10::ValueError` for other device types.
  static at::ScalarType default_dtype(c10::DeviceType device_type);

  /// Whether autocast is on for `device_type` in this thread right now.
  static bool is_enabled(c10::DeviceType device_type);

  /// The dtype autocast uses for `device_type` in this thread right now.
  static at::ScalarType current_dtype(c10::DeviceType device_type);

 private:
  void restore();
  void restore_device() const;  // the device's enabled flag and dtype

  c10::DeviceType device_type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
  bool active_ = false;
  autocast* outer_ = nullptr;  // the guard that was innermost when this one began
};

/// Whether this CPU multiplies matrices in `dtype` with native instructions:
/// bfloat16 with AVX-512 BF16 or AMX-BF16 (x86) or BF16 (Arm), float16 with
/// AVX-512 FP16 or AMX-FP16 (x86) or half-precision arithmetic (Arm);
/// float32 and float64 always. Elsewhere ATen's CPU matmuls in that dtype
/// can run many times slower than float32's (a GPT step: 12x on an
/// AVX2-only CPU), though memory still shrinks. `c10::ValueError` for a
/// dtype that is not floating point.
bool cpu_has_fast(at::ScalarType dtype);

/// The one-time warning (one per dtype per process) given where an autocast
/// guard or a fused optimizer's parameters put CPU matmuls in bfloat16 or
/// float16 on a CPU without `cpu_has_fast` for it: on (the default) or off.
/// Turning it on again lets it warn once more. Setting the environment
/// variable TORCHAMP_NO_SLOW_CPU_WARNING (any value) turns it off at start.
void set_slow_cpu_warning(bool enabled);

}  // namespace torchamp
