// torch::save / torch::load of a GradScaler: each state_dict entry becomes one
// archive attribute; loading reads back every key of every schema in the one
// key table (state_keys.h), so a Paddle facade's file loads too.

#include "scaler/serialize.h"

#include "scaler/state_keys.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace torchamp {
namespace detail {

void write_state(torch::serialize::OutputArchive& archive, const StateDict& state) {
  for (const auto& entry : state) {
    archive.write(entry.key().toStringRef(), entry.value());
  }
}

StateDict read_state(torch::serialize::InputArchive& archive) {
  StateDict state(c10::StringType::get(), c10::AnyType::get());
  for (const char* key : all_state_keys()) {
    c10::IValue value;
    if (archive.try_read(key, value)) {
      state.insert(key, std::move(value));
    }
  }
  return state;
}

}  // namespace detail

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  return detail::save_scaler(archive, scaler);
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  return detail::load_scaler(archive, scaler);
}

}  // namespace torchamp
