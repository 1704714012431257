#pragma once

// State dicts with every key of a schema at a non-default value, shared by the
// key-table tests and checkpoint_tool (the Python round trip).

#include <torchamp/grad_scaler.h>

#include <ATen/ops/full.h>

#include <cstdint>

namespace torchamp_test {

inline torchamp::StateDict empty_dict() {
  return torchamp::StateDict(c10::StringType::get(), c10::AnyType::get());
}

/// Every core key (PyTorch's five and torchamp's six), none at its default
/// (nor at the Paddle facade's).
inline torchamp::StateDict core_dict() {
  torchamp::StateDict d = empty_dict();
  d.insert("scale", 384.0);
  d.insert("growth_factor", 3.0);
  d.insert("backoff_factor", 0.25);
  d.insert("growth_interval", int64_t{7});
  d.insert("_growth_tracker", int64_t{3});
  d.insert("backoff_interval", int64_t{4});
  d.insert("_backoff_tracker", int64_t{2});
  d.insert("dynamic", false);
  d.insert("min_scale", 1.5);
  d.insert("max_consecutive_skips", int64_t{9});
  d.insert("_consecutive_skips", int64_t{5});
  return d;
}

/// Every Paddle key, none at its default (nor at the core's): the same values.
inline torchamp::StateDict paddle_dict() {
  torchamp::StateDict d = empty_dict();
  d.insert("scale", at::full({1}, 384.0f));
  d.insert("incr_ratio", 3.0);
  d.insert("decr_ratio", 0.25);
  d.insert("incr_every_n_steps", int64_t{7});
  d.insert("decr_every_n_nan_or_inf", int64_t{4});
  d.insert("incr_count", int64_t{3});
  d.insert("decr_count", int64_t{2});
  d.insert("use_dynamic_loss_scaling", false);
  return d;
}

}  // namespace torchamp_test
