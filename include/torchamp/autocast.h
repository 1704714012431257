#pragma once

/// \file
/// `torchamp::autocast`: an RAII guard over ATen's autocast state, the C++
/// counterpart of Python's `torch.autocast(device_type, dtype, enabled,
/// cache_enabled)`, with one API over LibTorch 1.13 and 2.x.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace torchamp {

/// While alive, ops on `device_type` run under ATen's autocast policy in
/// `dtype` (matmuls, convolutions and linear layers in half precision; the
/// ops ATen lists as float32-only stay float32).
///
/// ```
/// {
///   torchamp::autocast guard(torch::kCPU);   // bfloat16 on CPU
///   out = model->forward(x);
/// }
/// ```
///
/// The constructor saves the device's enabled flag and dtype and the cast
/// cache flag, then sets them; the destructor restores all three. Guards nest;
/// when the outermost guard (of any device) exits, the cast cache is cleared.
/// Like every RAII guard it belongs to one thread: autocast state is
/// thread-local in ATen.
///
/// Defaults: float16 on CUDA, bfloat16 on CPU, as Python. `cache_enabled =
/// nullopt` keeps the current cache setting (Python's default reads it too).
///
/// Throws `c10::ValueError`, before anything changes, for a device type other
/// than CPU or CUDA and for a dtype the linked LibTorch cannot autocast to on
/// that device (float16 on CPU before LibTorch 2.2; anything but
/// float16/bfloat16). Python warns and disables itself instead; a C++ caller
/// gets an error it cannot miss.
class autocast {
 public:
  explicit autocast(c10::DeviceType device_type, std::optional<at::ScalarType> dtype = std::nullopt,
                    bool enabled = true, std::optional<bool> cache_enabled = std::nullopt);
  ~autocast();

  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;
  autocast(autocast&&) = delete;
  autocast& operator=(autocast&&) = delete;

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
  c10::DeviceType device_type_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
  bool prev_cache_enabled_;
};

}  // namespace torchamp
