#include "optim/master_weights.h"

#include "optim/aten_masters.h"

#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <string>

namespace torchamp {
namespace optim {

MasterWeights::MasterWeights(bool on) : on_(on), store_(std::make_unique<Store>()) {}
MasterWeights::~MasterWeights() = default;

// A parameter's master weight, made at its first step: exactly the
// parameter's value (a bfloat16 parameter's remainder is zero).
void* make_master(MasterWeights& masters, const at::Tensor& p) {
  at::Tensor master = p.scalar_type() == at::kBFloat16
                          ? at::zeros(p.sizes(), p.options().dtype(at::kShort))
                          : p.to(at::kFloat).contiguous();
  void* data = data_of(master);
  masters.store().entries[p.unsafeGetTensorImpl()] = {p, std::move(master)};
  ++masters.store().version;
  return data;
}

// The archive entry of the master weights: one tensor per parameter that
// has one, keyed by its flat index in param-group order (as the base
// classes' own state), and a format marker.
constexpr const char* kMasterArchive = "torchamp_master_weights";

void save_masters(const torch::optim::Optimizer& opt, const MasterWeights& masters,
                  torch::serialize::OutputArchive& archive) {
  if (!masters.on()) {
    return;
  }
  torch::serialize::OutputArchive sub;
  sub.write("format", c10::IValue(static_cast<int64_t>(1)));
  const auto& entries = masters.store().entries;
  size_t flat = 0;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = entries.find(p.unsafeGetTensorImpl());
      if (it != entries.end()) {
        sub.write(std::to_string(flat), it->second.master, /*is_buffer=*/true);
      }
      ++flat;
    }
  }
  archive.write(kMasterArchive, sub);
}

// Reads and checks an archive's master weights against the optimizer,
// changing nothing.
std::unordered_map<const c10::TensorImpl*, MasterWeights::Store::Entry> read_masters(
    const torch::optim::Optimizer& opt, const MasterWeights& masters,
    torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive sub;
  const bool has = archive.try_read(kMasterArchive, sub);
  TORCH_CHECK_VALUE(has || !masters.on(),
                    "torchamp::optim load: this optimizer keeps master weights "
                    "(FusedOptions().master_weights(true)) but the archive has none (it was saved "
                    "by an optimizer without them); nothing was loaded.");
  TORCH_CHECK_VALUE(!has || masters.on(),
                    "torchamp::optim load: the archive holds master weights ('", kMasterArchive,
                    "') but this optimizer keeps none; construct it with "
                    "FusedOptions().master_weights(true). Nothing was loaded.");
  std::unordered_map<const c10::TensorImpl*, MasterWeights::Store::Entry> loaded;
  if (!has) {
    return loaded;
  }
  size_t flat = 0;
  for (const auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) {
      const std::string key = std::to_string(flat++);
      at::Tensor master;
      if (!sub.try_read(key, master, /*is_buffer=*/true)) {
        continue;  // no step yet: made at its first
      }
      const at::ScalarType want = p.scalar_type() == at::kBFloat16 ? at::kShort : at::kFloat;
      TORCH_CHECK_VALUE(low_precision(p.scalar_type()) && master.scalar_type() == want &&
                            master.numel() == p.numel() && master.device() == p.device(),
                        "torchamp::optim load: the master weight '", key, "' (",
                        master.scalar_type(), ", ", master.numel(),
                        " elements) does not fit parameter ", key, " (", p.scalar_type(), ", ",
                        p.numel(),
                        " elements); nothing was loaded. A bfloat16 parameter's master is an int16 "
                        "remainder, a float16 parameter's a float32 copy, one element each.");
      loaded[p.unsafeGetTensorImpl()] = {p, master.contiguous()};
    }
  }
  return loaded;
}

at::Tensor master_storage(const MasterWeights& masters, const at::Tensor& param) {
  const auto& entries = masters.store().entries;
  auto it = entries.find(param.unsafeGetTensorImpl());
  return it == entries.end() ? at::Tensor() : it->second.master;
}

// The float32 value of a parameter's master (a new tensor, on its device).
at::Tensor master_value(const MasterWeights& masters, const at::Tensor& param) {
  const at::Tensor master = master_storage(masters, param);
  if (!master.defined() || param.scalar_type() != at::kBFloat16) {
    return master.defined() ? master.clone() : master;
  }
  return join_bf16_master(param.contiguous(), master).view(param.sizes());
}

}  // namespace optim
}  // namespace torchamp
