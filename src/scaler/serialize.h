#pragma once

// A scaler's state dict to and from a torch::serialize archive (not
// installed): one archive attribute per key; used by every facade's
// operator<< and operator>>.

#include <torchamp/grad_scaler.h>

namespace torchamp {
namespace detail {

/// Writes each entry of `state` as an attribute of `archive`.
void write_state(torch::serialize::OutputArchive& archive, const StateDict& state);

/// Reads back every key of the key table the archive holds.
StateDict read_state(torch::serialize::InputArchive& archive);

/// operator<< and operator>> of any scaler with state_dict/load_state_dict.
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

}  // namespace detail
}  // namespace torchamp
