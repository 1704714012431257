// libFuzzer target for both scalers' load_state_dict.
//
// Default mode: the fuzzer's bytes are decoded into a StateDict (keys of every
// schema and random ones; floats including NaN, inf, subnormals and huge
// values; ints; bools; strings; tensors of random shape and dtype; None;
// lists) and loaded into a core and a Paddle scaler. Only typed c10::Errors
// (ValueError and NotImplementedError are c10::Errors) may come out; a crash,
// a hang, a sanitizer report or any other exception is a finding. A dict that
// loads must round-trip exactly through state_dict().
//
// TORCHAMP_FUZZ_PICKLE=1: the bytes go through torch::pickle_load first, as a
// checkpoint file would. LibTorch 1.13's reader is not safe on such input: it
// reads out of bounds on a malformed zip (tests/integration/fuzz/libtorch-findings/) and
// allocates whatever a corrupted length field says, so this mode finds
// LibTorch's bugs within seconds and is not part of ./scripts/test.
#include <torchamp/grad_scaler.h>
#include <torchamp/paddle.h>

#include "scaler/state_keys.h"

#include <ATen/ops/zeros.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

double any_double(FuzzedDataProvider& in) {
  const double special[] = {std::numeric_limits<double>::quiet_NaN(),
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            0.0,
                            -0.0,
                            std::numeric_limits<double>::denorm_min(),
                            1e39,
                            3.4028235e38,
                            1.0,
                            2.0,
                            0.5};
  return in.ConsumeBool() ? in.PickValueInArray(special) : in.ConsumeFloatingPoint<double>();
}

c10::IValue any_value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return any_double(in);
    case 1:
      return in.ConsumeIntegral<int64_t>();
    case 2:
      return static_cast<int64_t>(in.ConsumeIntegralInRange<int>(-3, 5000));
    case 3:
      return in.ConsumeBool();
    case 4:
      return in.ConsumeRandomLengthString(16);
    case 5: {
      const at::ScalarType dtypes[] = {at::kFloat, at::kDouble, at::kHalf,         at::kBFloat16,
                                       at::kInt,   at::kBool,   at::kComplexFloat, at::kLong};
      const auto dtype = in.PickValueInArray(dtypes);
      std::vector<int64_t> shape(in.ConsumeIntegralInRange<size_t>(0, 3));
      for (auto& d : shape) {
        d = in.ConsumeIntegralInRange<int64_t>(0, 3);
      }
      at::Tensor t = at::zeros(shape, at::TensorOptions().dtype(at::kDouble));
      auto flat = t.view({-1});
      for (int64_t i = 0; i < flat.numel(); ++i) {
        flat[i] = any_double(in);
      }
      return t.to(dtype);
    }
    case 6:
      return c10::IValue();
    default:
      return c10::List<int64_t>({in.ConsumeIntegral<int64_t>(), 1});
  }
}

torchamp::StateDict decode(FuzzedDataProvider& in) {
  torchamp::StateDict d(c10::StringType::get(), c10::AnyType::get());
  const int n = in.ConsumeIntegralInRange<int>(0, 20);
  for (int i = 0; i < n; ++i) {
    // Every key of every schema, from the library's one table.
    static const std::vector<const char*> keys = torchamp::detail::all_state_keys();
    const std::string key = in.ConsumeIntegralInRange<int>(0, 9) > 0
                                ? keys[in.ConsumeIntegralInRange<size_t>(0, keys.size() - 1)]
                                : in.ConsumeRandomLengthString(24);
    d.insert_or_assign(key, any_value(in));
  }
  return d;
}

template <class Scaler>
void load_and_check(const torchamp::StateDict& state) {
  Scaler scaler;
  try {
    scaler.load_state_dict(state);
  } catch (const c10::Error&) {
    return;  // a typed error: what bad input must get
  }
  // It loaded: the state must be sane and round-trip exactly.
  const double scale = scaler.get_scale();
  if (!(std::isfinite(scale) && scale > 0)) {
    throw std::logic_error("a loaded scale is not finite and > 0");
  }
  const auto saved = scaler.state_dict();
  Scaler again;
  again.load_state_dict(saved);
  if (torch::jit::pickle_save(again.state_dict()) != torch::jit::pickle_save(saved)) {
    throw std::logic_error("state_dict() does not round-trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  torchamp::StateDict state(c10::StringType::get(), c10::AnyType::get());
  static const bool through_pickle = std::getenv("TORCHAMP_FUZZ_PICKLE") != nullptr;
  if (through_pickle) {
    const std::vector<char> bytes(reinterpret_cast<const char*>(data),
                                  reinterpret_cast<const char*>(data) + size);
    c10::IValue value;
    try {
      value = torch::jit::pickle_load(bytes);
    } catch (const c10::Error&) {
      return 0;  // not a pickle LibTorch can read: its typed error
    }
    if (!value.isGenericDict()) {
      return 0;
    }
    state = value.toGenericDict();
  } else {
    FuzzedDataProvider in(data, size);
    state = decode(in);
  }
  load_and_check<torchamp::GradScaler>(state);
  load_and_check<torchamp::paddle::GradScaler>(state);
  return 0;
}
