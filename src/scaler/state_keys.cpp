#include "scaler/state_keys.h"

#include <torchamp/scale_schedule.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

namespace torchamp {
namespace detail {
namespace {

using Type = StateKey::Type;
using In = StateKey::In;
constexpr In R = In::kRequired;
constexpr In O = In::kOptional;
constexpr In A = In::kAbsent;

// How each schema is named in errors, and whether it keeps the scale as a
// 1-element float32 tensor (Paddle) rather than a float.
struct SchemaInfo {
  const char* name;
  bool scale_as_tensor;
};
constexpr std::array<SchemaInfo, kSchemaCount> kSchemas = {{
    {"PyTorch's", false},
    {"Paddle's", true},
    {"lucid's", false},
}};

StateKey row(std::array<const char*, kSchemaCount> key, std::array<In, kSchemaCount> in,
             double ScalerState::*member, void (*check)(const ScalerState&, const char*),
             Type type = Type::kDouble) {
  return {key, in, type, member, nullptr, nullptr, check};
}
StateKey row(std::array<const char*, kSchemaCount> key, std::array<In, kSchemaCount> in,
             int64_t ScalerState::*member, void (*check)(const ScalerState&, const char*)) {
  return {key, in, Type::kInt, nullptr, member, nullptr, check};
}
StateKey row(std::array<const char*, kSchemaCount> key, std::array<In, kSchemaCount> in,
             bool ScalerState::*member) {
  return {key, in, Type::kBool, nullptr, nullptr, member, nullptr};
}

//                core                      paddle                     lucid
const std::vector<StateKey> kTable = {
    row(
        {"scale", "scale", "scale"}, {R, R, R}, &ScalerState::scale,
        [](const ScalerState& s, const char* n) { ScaleSchedule::check_scale(s.scale, n); },
        Type::kScale),
    row({"growth_factor", "incr_ratio", "growth_factor"}, {R, R, R}, &ScalerState::growth_factor,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_growth_factor(s.growth_factor, n);
        }),
    row({"backoff_factor", "decr_ratio", "backoff_factor"}, {R, R, R}, &ScalerState::backoff_factor,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_backoff_factor(s.backoff_factor, n);
        }),
    row({"growth_interval", "incr_every_n_steps", "growth_interval"}, {R, R, R},
        &ScalerState::growth_interval,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_interval(s.growth_interval, n);
        }),
    row({"_growth_tracker", "incr_count", "growth_tracker"}, {R, R, R},
        &ScalerState::growth_tracker,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_tracker(s.growth_tracker, n);
        }),
    row({"backoff_interval", "decr_every_n_nan_or_inf", nullptr}, {O, R, A},
        &ScalerState::backoff_interval,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_interval(s.backoff_interval, n);
        }),
    row({"_backoff_tracker", "decr_count", nullptr}, {O, R, A}, &ScalerState::backoff_tracker,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_tracker(s.backoff_tracker, n);
        }),
    row({"dynamic", "use_dynamic_loss_scaling", nullptr}, {O, R, A}, &ScalerState::dynamic),
    row({"min_scale", nullptr, nullptr}, {O, A, A}, &ScalerState::min_scale,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_min_scale(s.min_scale, n);
        }),
    row({"max_consecutive_skips", nullptr, nullptr}, {O, A, A}, &ScalerState::max_consecutive_skips,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_tracker(s.max_consecutive_skips, n);
        }),
    row({"_consecutive_skips", nullptr, nullptr}, {O, A, A}, &ScalerState::consecutive_skips,
        [](const ScalerState& s, const char* n) {
          ScaleSchedule::check_tracker(s.consecutive_skips, n);
        }),
};

size_t index(Schema schema) {
  return static_cast<size_t>(schema);
}

bool in_schema(const char* key, size_t schema) {
  for (const StateKey& k : kTable) {
    if (k.key[schema] != nullptr && std::string(k.key[schema]) == key) {
      return true;
    }
  }
  return false;
}

bool has(const StateDict& dict, const char* key) {
  return dict.find(c10::IValue(key)) != dict.end();
}

std::string quoted(const char* key) {
  return std::string("state_dict['") + key + "']";
}

// The dict's keys that some schema knows, in table order.
std::vector<const char*> known_keys(const StateDict& dict) {
  std::vector<const char*> keys;
  for (const char* key : all_state_keys()) {
    if (has(dict, key)) {
      keys.push_back(key);
    }
  }
  return keys;
}

// The schema every known key of the dict belongs to (the first such in table
// order when several fit, as a dict of shared keys only); throws naming one key
// of each of two schemas when none fits.
size_t detect_schema(const StateDict& dict) {
  const std::vector<const char*> keys = known_keys(dict);
  std::array<size_t, kSchemaCount> count{};
  for (size_t s = 0; s < kSchemaCount; ++s) {
    for (const char* key : keys) {
      count[s] += in_schema(key, s) ? 1 : 0;
    }
    if (count[s] == keys.size()) {
      return s;
    }
  }
  // Mixed: the schema holding most of the keys, a key outside it and that
  // key's schema; each named with a key of its own the other lacks, in table
  // order of the schemas.
  size_t most = 0;
  for (size_t s = 1; s < kSchemaCount; ++s) {
    most = count[s] > count[most] ? s : most;
  }
  size_t other = 0;
  for (const char* key : keys) {
    if (!in_schema(key, most)) {
      while (!in_schema(key, other)) {
        ++other;
      }
      break;
    }
  }
  auto own_key = [&keys](size_t schema, size_t not_in) {
    for (const char* key : keys) {
      if (in_schema(key, schema) && !in_schema(key, not_in)) {
        return key;
      }
    }
    return "?";
  };
  const size_t first = std::min(most, other), second = std::max(most, other);
  TORCH_CHECK_VALUE(false, "state_dict mixes ", kSchemas[first].name, " schema (key '",
                    own_key(first, second), "') and ", kSchemas[second].name, " (key '",
                    own_key(second, first), "'); it must be one or the other");
}

double read_number(const c10::IValue& v, const char* key) {
  TORCH_CHECK_VALUE(v.isDouble() || v.isInt(), quoted(key), " must be a float, got ", v.tagKind(),
                    " ", v);
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

// Paddle keeps the scale as a 1-element float tensor; a plain number is
// accepted in every schema.
double read_scale(const c10::IValue& v, const char* key) {
  if (!v.isTensor()) {
    return read_number(v, key);
  }
  const at::Tensor& t = v.toTensor();
  TORCH_CHECK_VALUE(t.defined() && t.numel() == 1 && at::isFloatingType(t.scalar_type()),
                    quoted(key), " must be a 1-element floating-point tensor, got ",
                    t.defined() ? t.toString() : std::string("an undefined tensor"), " of ",
                    t.defined() ? t.numel() : 0, " elements");
  return t.to(at::kDouble).item<double>();
}

}  // namespace

const std::vector<StateKey>& state_keys() {
  return kTable;
}

std::vector<const char*> all_state_keys() {
  std::vector<const char*> keys;
  for (size_t s = 0; s < kSchemaCount; ++s) {
    for (const StateKey& k : kTable) {
      const char* key = k.key[s];
      bool seen = key == nullptr;
      for (const char* other : keys) {
        seen = seen || std::string(other) == key;
      }
      if (!seen) {
        keys.push_back(key);
      }
    }
  }
  return keys;
}

StateDict write_state_dict(const ScalerState& state, Schema schema) {
  const size_t s = index(schema);
  StateDict dict(c10::StringType::get(), c10::AnyType::get());
  for (const StateKey& k : kTable) {
    if (k.in[s] == In::kAbsent) {
      continue;
    }
    switch (k.type) {
      case Type::kScale:
        if (kSchemas[s].scale_as_tensor) {
          dict.insert(k.key[s],
                      at::full({1}, state.*k.as_double, at::TensorOptions().dtype(at::kFloat)));
        } else {
          dict.insert(k.key[s], state.*k.as_double);
        }
        break;
      case Type::kDouble:
        dict.insert(k.key[s], state.*k.as_double);
        break;
      case Type::kInt:
        dict.insert(k.key[s], state.*k.as_int);
        break;
      case Type::kBool:
        dict.insert(k.key[s], state.*k.as_bool);
        break;
    }
  }
  return dict;
}

ScalerState read_state_dict(const StateDict& dict, ScalerState current) {
  const size_t s = detect_schema(dict);
  ScalerState next = current;
  for (const StateKey& k : kTable) {
    const char* key = k.key[s];
    if (k.in[s] == In::kAbsent || (k.in[s] == In::kOptional && !has(dict, key))) {
      continue;
    }
    auto it = dict.find(c10::IValue(key));
    TORCH_CHECK_VALUE(it != dict.end(), "state_dict is missing the key '", key, "'");
    const c10::IValue& v = it->value();
    switch (k.type) {
      case Type::kScale:
        next.*k.as_double = read_scale(v, key);
        break;
      case Type::kDouble:
        next.*k.as_double = read_number(v, key);
        break;
      case Type::kInt:
        TORCH_CHECK_VALUE(v.isInt(), quoted(key), " must be an int, got ", v.tagKind(), " ", v);
        next.*k.as_int = v.toInt();
        break;
      case Type::kBool:
        TORCH_CHECK_VALUE(v.isBool(), quoted(key), " must be a bool, got ", v.tagKind(), " ", v);
        next.*k.as_bool = v.toBool();
        break;
    }
    if (k.check != nullptr) {
      k.check(next, quoted(key).c_str());
    }
  }
  return next;
}

ScalerState state_of(const GradScaler& scaler) {
  ScalerState s;
  s.scale = scaler.get_scale();
  s.growth_factor = scaler.get_growth_factor();
  s.backoff_factor = scaler.get_backoff_factor();
  s.growth_interval = scaler.get_growth_interval();
  s.growth_tracker = scaler.get_growth_tracker();
  s.backoff_interval = scaler.get_backoff_interval();
  s.backoff_tracker = scaler.get_backoff_tracker();
  s.dynamic = scaler.is_dynamic();
  s.min_scale = scaler.get_min_scale();
  s.max_consecutive_skips = scaler.get_max_consecutive_skips();
  s.consecutive_skips = scaler.get_consecutive_skips();
  return s;
}

}  // namespace detail
}  // namespace torchamp
