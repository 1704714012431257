#include <torchamp/autocast.h>

#include "compat.h"

namespace torchamp {
namespace {

void check_device_type(c10::DeviceType device_type) {
  TORCH_CHECK_VALUE(device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA,
                    "autocast: device_type must be CPU or CUDA, got ", device_type);
}

}  // namespace

bool autocast::is_supported(c10::DeviceType device_type, at::ScalarType dtype) {
  switch (device_type) {
    case c10::DeviceType::CPU:
      return dtype == at::kBFloat16 || (dtype == at::kHalf && compat::kCpuAutocastFloat16);
    case c10::DeviceType::CUDA:
      return dtype == at::kHalf || dtype == at::kBFloat16;
    default:
      return false;
  }
}

at::ScalarType autocast::default_dtype(c10::DeviceType device_type) {
  check_device_type(device_type);
  return device_type == c10::DeviceType::CUDA ? at::kHalf : at::kBFloat16;
}

bool autocast::is_enabled(c10::DeviceType device_type) {
  check_device_type(device_type);
  return compat::autocast_enabled(device_type);
}

at::ScalarType autocast::current_dtype(c10::DeviceType device_type) {
  check_device_type(device_type);
  return compat::autocast_dtype(device_type);
}

autocast::autocast(c10::DeviceType device_type, std::optional<at::ScalarType> dtype, bool enabled,
                   std::optional<bool> cache_enabled)
    : device_type_(device_type) {
  // Validate everything before touching any state.
  const at::ScalarType fast_dtype = dtype ? *dtype : default_dtype(device_type);
  TORCH_CHECK_VALUE(is_supported(device_type, fast_dtype), "autocast: dtype ", fast_dtype,
                    " is not supported on ", device_type, " by the linked LibTorch ", TORCH_VERSION,
                    " (CPU: BFloat16", compat::kCpuAutocastFloat16 ? " and Half" : "",
                    "; CUDA: Half and BFloat16)");

  prev_enabled_ = compat::autocast_enabled(device_type);
  prev_dtype_ = compat::autocast_dtype(device_type);
  prev_cache_enabled_ = at::autocast::is_autocast_cache_enabled();

  compat::set_autocast_enabled(device_type, enabled);
  compat::set_autocast_dtype(device_type, fast_dtype);
  at::autocast::increment_nesting();
  if (cache_enabled) {
    at::autocast::set_autocast_cache_enabled(*cache_enabled);
  }
}

autocast::~autocast() {
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  compat::set_autocast_enabled(device_type_, prev_enabled_);
  compat::set_autocast_dtype(device_type_, prev_dtype_);
  at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
}

}  // namespace torchamp
