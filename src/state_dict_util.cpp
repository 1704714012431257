#include "state_dict_util.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>

namespace torchamp {
namespace detail {
namespace {

const char* const kPyTorchKeys[] = {"growth_factor",   "backoff_factor",   "growth_interval",
                                    "_growth_tracker", "backoff_interval", "_backoff_tracker",
                                    "dynamic"};
const char* const kPaddleKeys[] = {
    "incr_ratio", "decr_ratio", "incr_every_n_steps",      "decr_every_n_nan_or_inf",
    "incr_count", "decr_count", "use_dynamic_loss_scaling"};

bool has(const StateDict& state, const char* key) {
  return state.find(c10::IValue(key)) != state.end();
}

std::string name(const char* key) {
  return std::string("state_dict['") + key + "']";
}

c10::IValue read(const StateDict& state, const char* key) {
  auto it = state.find(c10::IValue(key));
  TORCH_CHECK_VALUE(it != state.end(), "state_dict is missing the key '", key, "'");
  return it->value();
}

double read_double(const StateDict& state, const char* key) {
  const c10::IValue v = read(state, key);
  TORCH_CHECK_VALUE(v.isDouble() || v.isInt(), name(key), " must be a float, got ", v.tagKind(),
                    " ", v);
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

int64_t read_int(const StateDict& state, const char* key) {
  const c10::IValue v = read(state, key);
  TORCH_CHECK_VALUE(v.isInt(), name(key), " must be an int, got ", v.tagKind(), " ", v);
  return v.toInt();
}

bool read_bool(const StateDict& state, const char* key) {
  const c10::IValue v = read(state, key);
  TORCH_CHECK_VALUE(v.isBool(), name(key), " must be a bool, got ", v.tagKind(), " ", v);
  return v.toBool();
}

// Paddle keeps the scale as a 1-element float tensor; a plain number is
// accepted too (PyTorch's schema stores a float).
double read_scale(const StateDict& state, const char* key) {
  const c10::IValue v = read(state, key);
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    TORCH_CHECK_VALUE(t.defined() && t.numel() == 1 && at::isFloatingType(t.scalar_type()),
                      name(key), " must be a 1-element floating-point tensor, got ",
                      t.defined() ? t.toString() : std::string("an undefined tensor"), " of ",
                      t.defined() ? t.numel() : 0, " elements");
    return t.to(at::kDouble).item<double>();
  }
  return read_double(state, key);
}

}  // namespace

ParsedState parse_state_dict(const StateDict& state) {
  const char* pytorch_key = nullptr;
  const char* paddle_key = nullptr;
  for (const char* key : kPyTorchKeys) {
    if (pytorch_key == nullptr && has(state, key)) {
      pytorch_key = key;
    }
  }
  for (const char* key : kPaddleKeys) {
    if (paddle_key == nullptr && has(state, key)) {
      paddle_key = key;
    }
  }
  TORCH_CHECK_VALUE(pytorch_key == nullptr || paddle_key == nullptr,
                    "state_dict mixes PyTorch's schema (key '", pytorch_key,
                    "') and Paddle's (key '", paddle_key, "'); it must be one or the other");

  ParsedState p;
  if (paddle_key != nullptr) {
    p.schema = Schema::kPaddle;
    p.scale = read_scale(state, "scale");
    p.growth_factor = read_double(state, "incr_ratio");
    p.backoff_factor = read_double(state, "decr_ratio");
    p.growth_interval = read_int(state, "incr_every_n_steps");
    p.backoff_interval = read_int(state, "decr_every_n_nan_or_inf");
    p.growth_tracker = read_int(state, "incr_count");
    p.backoff_tracker = read_int(state, "decr_count");
    p.dynamic = read_bool(state, "use_dynamic_loss_scaling");
    ScaleSchedule::check_scale(p.scale, "state_dict['scale']");
    ScaleSchedule::check_growth_factor(p.growth_factor, "state_dict['incr_ratio']");
    ScaleSchedule::check_backoff_factor(p.backoff_factor, "state_dict['decr_ratio']");
    ScaleSchedule::check_interval(p.growth_interval, "state_dict['incr_every_n_steps']");
    ScaleSchedule::check_interval(*p.backoff_interval, "state_dict['decr_every_n_nan_or_inf']");
    ScaleSchedule::check_tracker(p.growth_tracker, "state_dict['incr_count']");
    ScaleSchedule::check_tracker(*p.backoff_tracker, "state_dict['decr_count']");
    return p;
  }
  p.schema = Schema::kPyTorch;
  p.scale = read_scale(state, "scale");
  p.growth_factor = read_double(state, "growth_factor");
  p.backoff_factor = read_double(state, "backoff_factor");
  p.growth_interval = read_int(state, "growth_interval");
  p.growth_tracker = read_int(state, "_growth_tracker");
  if (has(state, "backoff_interval")) {
    p.backoff_interval = read_int(state, "backoff_interval");
  }
  if (has(state, "_backoff_tracker")) {
    p.backoff_tracker = read_int(state, "_backoff_tracker");
  }
  if (has(state, "dynamic")) {
    p.dynamic = read_bool(state, "dynamic");
  }
  if (has(state, "min_scale")) {
    p.min_scale = read_double(state, "min_scale");
    ScaleSchedule::check_min_scale(*p.min_scale, "state_dict['min_scale']");
  }
  if (has(state, "max_consecutive_skips")) {
    p.max_consecutive_skips = read_int(state, "max_consecutive_skips");
    ScaleSchedule::check_tracker(*p.max_consecutive_skips, "state_dict['max_consecutive_skips']");
  }
  if (has(state, "_consecutive_skips")) {
    p.consecutive_skips = read_int(state, "_consecutive_skips");
    ScaleSchedule::check_tracker(*p.consecutive_skips, "state_dict['_consecutive_skips']");
  }
  ScaleSchedule::check_scale(p.scale, "state_dict['scale']");
  ScaleSchedule::check_growth_factor(p.growth_factor, "state_dict['growth_factor']");
  ScaleSchedule::check_backoff_factor(p.backoff_factor, "state_dict['backoff_factor']");
  ScaleSchedule::check_interval(p.growth_interval, "state_dict['growth_interval']");
  ScaleSchedule::check_tracker(p.growth_tracker, "state_dict['_growth_tracker']");
  if (p.backoff_interval) {
    ScaleSchedule::check_interval(*p.backoff_interval, "state_dict['backoff_interval']");
  }
  if (p.backoff_tracker) {
    ScaleSchedule::check_tracker(*p.backoff_tracker, "state_dict['_backoff_tracker']");
  }
  return p;
}

ScaleSchedule apply_state(ScaleSchedule schedule, const ParsedState& parsed) {
  schedule.set_scale(parsed.scale);
  schedule.set_growth_factor(parsed.growth_factor);
  schedule.set_backoff_factor(parsed.backoff_factor);
  schedule.set_growth_interval(parsed.growth_interval);
  schedule.set_growth_tracker(parsed.growth_tracker);
  if (parsed.backoff_interval) {
    schedule.set_backoff_interval(*parsed.backoff_interval);
  }
  if (parsed.backoff_tracker) {
    schedule.set_backoff_tracker(*parsed.backoff_tracker);
  }
  if (parsed.dynamic) {
    schedule.set_dynamic(*parsed.dynamic);
  }
  if (parsed.min_scale) {
    schedule.set_min_scale(*parsed.min_scale);
  }
  return schedule;
}

}  // namespace detail
}  // namespace torchamp
