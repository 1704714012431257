#pragma once

// The one table of a scaler's state-dict keys, for every schema torchamp
// reads or writes (not installed). Every save and load path goes through it:
// GradScaler::state_dict/load_state_dict, the Paddle facade's, and
// torch::save/torch::load (serialize.cpp).
//
// Schemas:
//   core    PyTorch's five keys (scale, growth_factor, backoff_factor,
//           growth_interval, _growth_tracker) plus torchamp's six
//           (backoff_interval, _backoff_tracker, dynamic, min_scale,
//           max_consecutive_skips, _consecutive_skips), which PyTorch ignores
//           and which keep their values when a dict lacks them;
//   paddle  Paddle's eight: scale (a 1-element float32 tensor), incr_ratio,
//           decr_ratio, incr_every_n_steps, decr_every_n_nan_or_inf,
//           incr_count, decr_count, use_dynamic_loss_scaling;
//   lucid   the reference page's framework (lucid.amp.GradScaler): scale,
//           growth_factor, backoff_factor, growth_interval, growth_tracker.

#include <torchamp/grad_scaler.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace torchamp {
namespace detail {

enum class Schema { kCore = 0, kPaddle = 1, kLucid = 2 };
constexpr size_t kSchemaCount = 3;

/// A scaler's whole persistent state, as plain numbers.
struct ScalerState {
  double scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1;
  int64_t growth_tracker = 0;
  int64_t backoff_interval = 1;
  int64_t backoff_tracker = 0;
  bool dynamic = true;
  double min_scale = 0.0;
  int64_t max_consecutive_skips = 0;
  int64_t consecutive_skips = 0;
};

/// One field of ScalerState and its key in each schema.
struct StateKey {
  enum class Type { kScale, kDouble, kInt, kBool };  // kScale: a double, or a 1-element tensor
  enum class In { kAbsent, kRequired, kOptional };
  std::array<const char*, kSchemaCount> key;  // nullptr where absent
  std::array<In, kSchemaCount> in;
  Type type;
  // Exactly one of these is set, by type.
  double ScalerState::*as_double;
  int64_t ScalerState::*as_int;
  bool ScalerState::*as_bool;
  // Throws c10::ValueError "<name> must be ..." for an out-of-range value.
  void (*check)(const ScalerState& state, const char* name);
};

/// The table, in the order keys are written.
const std::vector<StateKey>& state_keys();

/// Every key of every schema, once each (what torch::load looks for).
std::vector<const char*> all_state_keys();

/// The dict a scaler of `schema` writes: every key the schema has.
StateDict write_state_dict(const ScalerState& state, Schema schema);

/// Reads a dict of any schema over `current`: detects the schema from its
/// keys, checks every key's presence, type and value, and returns `current`
/// with every field the dict holds replaced. Throws c10::ValueError naming the
/// key on the first problem (a missing required key, a wrong type, a value out
/// of range, keys of two schemas at once), before anything changes. Unknown
/// keys are ignored. The empty dict is the caller's to refuse (each facade
/// has its own message).
ScalerState read_state_dict(const StateDict& dict, ScalerState current);

/// A scaler's state, from its public getters.
ScalerState state_of(const GradScaler& scaler);

}  // namespace detail
}  // namespace torchamp
