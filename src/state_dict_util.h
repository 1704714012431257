#pragma once

// Typed reads from a StateDict (not installed): each throws c10::ValueError
// naming the key when it is missing (and required) or has the wrong type.

#include <torchamp/grad_scaler.h>

#include <c10/util/Exception.h>

#include <optional>

namespace torchamp {
namespace detail {

inline std::optional<c10::IValue> read_value(const StateDict& state, const char* key,
                                             bool required) {
  auto it = state.find(c10::IValue(key));
  if (it == state.end()) {
    TORCH_CHECK_VALUE(!required, "state_dict is missing the key '", key, "'");
    return std::nullopt;
  }
  return it->value();
}

/// A float; an int is accepted and converted.
inline std::optional<double> read_double(const StateDict& state, const char* key, bool required) {
  auto v = read_value(state, key, required);
  if (!v) {
    return std::nullopt;
  }
  TORCH_CHECK_VALUE(v->isDouble() || v->isInt(), "state_dict['", key, "'] must be a float, got ",
                    v->tagKind(), " ", *v);
  return v->isDouble() ? v->toDouble() : static_cast<double>(v->toInt());
}

inline std::optional<int64_t> read_int(const StateDict& state, const char* key, bool required) {
  auto v = read_value(state, key, required);
  if (!v) {
    return std::nullopt;
  }
  TORCH_CHECK_VALUE(v->isInt(), "state_dict['", key, "'] must be an int, got ", v->tagKind(), " ",
                    *v);
  return v->toInt();
}

inline std::optional<bool> read_bool(const StateDict& state, const char* key, bool required) {
  auto v = read_value(state, key, required);
  if (!v) {
    return std::nullopt;
  }
  TORCH_CHECK_VALUE(v->isBool(), "state_dict['", key, "'] must be a bool, got ", v->tagKind(), " ",
                    *v);
  return v->toBool();
}

}  // namespace detail
}  // namespace torchamp
