#include "optim/rounding.h"

#include <c10/util/Exception.h>

#include <string>

namespace torchamp {
namespace optim {

// The archive entry of the stochastic rounding's generator: its seed and
// count, as int64 bits.
constexpr const char* kRoundingArchive = "torchamp_stochastic_rounding";

void save_rounding(const StochasticRounding& rounding, torch::serialize::OutputArchive& archive) {
  if (!rounding.on) {
    return;
  }
  torch::serialize::OutputArchive sub;
  sub.write("format", c10::IValue(static_cast<int64_t>(1)));
  sub.write("seed", c10::IValue(static_cast<int64_t>(rounding.seed)));
  sub.write("updates", c10::IValue(static_cast<int64_t>(rounding.updates)));
  archive.write(kRoundingArchive, sub);
}

StochasticRounding read_rounding(const StochasticRounding& rounding,
                                 torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive sub;
  const bool has = archive.try_read(kRoundingArchive, sub);
  TORCH_CHECK_VALUE(has || !rounding.on,
                    "torchamp::optim load: this optimizer rounds stochastically "
                    "(FusedOptions().stochastic_rounding(true)) but the archive has no generator "
                    "('",
                    kRoundingArchive,
                    "': it was saved by an optimizer without stochastic rounding); nothing was "
                    "loaded.");
  TORCH_CHECK_VALUE(!has || rounding.on,
                    "torchamp::optim load: the archive holds a stochastic "
                    "rounding generator ('",
                    kRoundingArchive,
                    "') but this optimizer rounds to nearest; construct it with "
                    "FusedOptions().stochastic_rounding(true). Nothing was loaded.");
  if (!has) {
    return rounding;
  }
  c10::IValue format, seed, updates;
  const bool complete = sub.try_read("format", format) && sub.try_read("seed", seed) &&
                        sub.try_read("updates", updates) && format.isInt() && seed.isInt() &&
                        updates.isInt();
  TORCH_CHECK_VALUE(complete && format.toInt() == 1, "torchamp::optim load: '", kRoundingArchive,
                    "' is not a format-1 generator (integers format = 1, seed, updates; found "
                    "format ",
                    format.isInt() ? std::to_string(format.toInt()) : std::string("missing"),
                    ", seed ", seed.isInt() ? "present" : "missing", ", updates ",
                    updates.isInt() ? "present" : "missing", "); nothing was loaded.");
  StochasticRounding loaded = rounding;
  loaded.seed = static_cast<uint64_t>(seed.toInt());
  loaded.updates = static_cast<uint64_t>(updates.toInt());
  return loaded;
}

}  // namespace optim
}  // namespace torchamp
