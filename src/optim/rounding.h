#pragma once

// The fused optimizers' stochastic rounding generator (FusedOptions()
// .stochastic_rounding): its state and its archive entry. Private to
// src/optim/.

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <map>
#include <vector>

namespace torchamp {
namespace optim {

// Stochastic rounding's generator (the fused optimizers' other part of the
// state beside the master weights): the seed,
// and the count of updates rounded so far (a skipped step counts none), which
// with the parameter's index keys each update's noise (kernels::rounding_key).
struct StochasticRounding {
  bool on = false;
  uint64_t seed = 0;
  uint64_t updates = 0;
  // The count on a device (int64, 0-dim) while a device scaler's flags
  // decide which steps count (ATen's path): ahead of `updates`, which catches
  // up when read (`stale`), one read back.
  at::Tensor device_updates;
  bool stale = false;
  // ATen's path: the parameters' layouts for the noise (aten_rounding.h's
  // rounding_layout), kept between steps by what they describe.
  std::map<std::vector<int64_t>, at::Tensor> layouts;
};

// Its archive entry (save), and reading and checking one against the
// optimizer's, changing nothing (load): the generator to continue with.
void save_rounding(const StochasticRounding& rounding, torch::serialize::OutputArchive& archive);
StochasticRounding read_rounding(const StochasticRounding& rounding,
                                 torch::serialize::InputArchive& archive);

}  // namespace optim
}  // namespace torchamp
