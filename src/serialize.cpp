// torch::save / torch::load of both scalers: each state_dict entry becomes one
// archive attribute, so either facade's file loads into either facade.

#include <torchamp/grad_scaler.h>
#include <torchamp/paddle.h>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace torchamp {
namespace {

// Every key either schema may hold.
const char* const kKeys[] = {
    "scale",           "growth_factor",    "backoff_factor",          "growth_interval",
    "_growth_tracker", "backoff_interval", "_backoff_tracker",        "dynamic",
    "incr_ratio",      "decr_ratio",       "incr_every_n_steps",      "decr_every_n_nan_or_inf",
    "incr_count",      "decr_count",       "use_dynamic_loss_scaling"};

void write_state(torch::serialize::OutputArchive& archive, const StateDict& state) {
  for (const auto& entry : state) {
    archive.write(entry.key().toStringRef(), entry.value());
  }
}

StateDict read_state(torch::serialize::InputArchive& archive) {
  StateDict state(c10::StringType::get(), c10::AnyType::get());
  for (const char* key : kKeys) {
    c10::IValue value;
    if (archive.try_read(key, value)) {
      state.insert(key, std::move(value));
    }
  }
  return state;
}

// One implementation for both facades: each state_dict entry is an archive
// attribute, read back into a dict for load_state_dict.
template <class Scaler>
torch::serialize::OutputArchive& save_scaler(torch::serialize::OutputArchive& archive,
                                             const Scaler& scaler) {
  write_state(archive, scaler.state_dict());
  return archive;
}

template <class Scaler>
torch::serialize::InputArchive& load_scaler(torch::serialize::InputArchive& archive,
                                            Scaler& scaler) {
  scaler.load_state_dict(read_state(archive));
  return archive;
}

}  // namespace

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  return save_scaler(archive, scaler);
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  return load_scaler(archive, scaler);
}

namespace paddle {

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  return save_scaler(archive, scaler);
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  return load_scaler(archive, scaler);
}

}  // namespace paddle
}  // namespace torchamp
