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

}  // namespace detail
}  // namespace torchamp
