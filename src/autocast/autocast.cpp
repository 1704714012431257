#include <torchamp/autocast.h>

#include "autocast/cpu_dtype.h"
#include "compat/compat.h"

namespace torchamp {
namespace {

void check_device_type(c10::DeviceType device_type) {
  TORCH_CHECK_VALUE(device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA,
                    "autocast: device_type must be CPU or CUDA, got ", device_type);
}

// This thread's innermost active guard; each guard links to the one that was
// innermost when it began. exit() uses it to refuse an out-of-order exit, and
// an out-of-order destruction uses it to hand its saved state to the guard
// above it.
thread_local autocast* t_innermost = nullptr;

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
                    " is not supported on ", device_type, " by the running LibTorch ",
                    compat::runtime_torch_version(), " (CPU: BFloat16",
                    compat::kCpuAutocastFloat16 ? " and Half" : "", "; CUDA: Half and BFloat16)");
  // Before any state changes: a warning handler may throw.
  if (enabled && device_type == c10::DeviceType::CPU) {
    detail::warn_if_slow_on_cpu(fast_dtype, "autocast");
  }

  prev_enabled_ = compat::autocast_enabled(device_type);
  prev_dtype_ = compat::autocast_dtype(device_type);
  prev_cache_enabled_ = at::autocast::is_autocast_cache_enabled();

  compat::set_autocast_enabled(device_type, enabled);
  compat::set_autocast_dtype(device_type, fast_dtype);
  at::autocast::increment_nesting();
  if (cache_enabled) {
    at::autocast::set_autocast_cache_enabled(*cache_enabled);
  }
  active_ = true;
  outer_ = t_innermost;
  t_innermost = this;
}

autocast::autocast(c10::Device device, std::optional<at::ScalarType> dtype, bool enabled,
                   std::optional<bool> cache_enabled)
    : autocast(device.type(), dtype, enabled, cache_enabled) {}

autocast::autocast(c10::DeviceType device_type, bool enabled)
    : autocast(device_type, std::nullopt, enabled) {}

autocast::autocast(c10::Device device, bool enabled)
    : autocast(device.type(), std::nullopt, enabled) {}

void autocast::exit() {
  if (!active_) {
    return;
  }
  // (In a thread with no guard, as when a guard is exited from another
  // thread than its own, restore() restores what it saved.)
  TORCH_CHECK(t_innermost == this || t_innermost == nullptr, "autocast::exit(): a guard for ",
              t_innermost->device_type_, " constructed after this ", device_type_,
              " guard is still active; exit the inner guard first (nested with-blocks "
              "exit innermost first)");
  restore();
}

autocast::~autocast() {
  if (active_) {
    restore();
  }
}

void autocast::restore_device() const {
  compat::set_autocast_enabled(device_type_, prev_enabled_);
  compat::set_autocast_dtype(device_type_, prev_dtype_);
}

void autocast::restore() {
  active_ = false;
  if (at::autocast::decrement_nesting() == 0) {
    at::autocast::clear_cache();
  }
  // Find the guard entered just after this one and the nearest one above it
  // on the same device type (both null when this guard is the innermost).
  autocast* next = nullptr;
  autocast* same_device = nullptr;
  for (autocast* g = t_innermost; g != nullptr && g != this; g = g->outer_) {
    next = g;
    if (g->device_type_ == device_type_) {
      same_device = g;
    }
  }
  if (next == nullptr || next->outer_ != this) {
    // The innermost guard (the only case exit() allows), or one that is not
    // in this thread's chain: restore what the constructor changed.
    if (t_innermost == this) {
      t_innermost = outer_;
    }
    restore_device();
    at::autocast::set_autocast_cache_enabled(prev_cache_enabled_);
    return;
  }
  // Destroyed while a later guard is alive (only heap-allocated guards can
  // be): the later guards' settings stay in effect, and what this guard saved
  // goes to the ones that restore over it, so that once they exit the state
  // is what it was before this guard.
  next->outer_ = outer_;
  next->prev_cache_enabled_ = prev_cache_enabled_;
  if (same_device != nullptr) {
    same_device->prev_enabled_ = prev_enabled_;
    same_device->prev_dtype_ = prev_dtype_;
  } else {
    restore_device();
  }
}

}  // namespace torchamp
