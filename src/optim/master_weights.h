#pragma once

// The fused optimizers' master weights (their part of the state), and what
// every file of the layer reads tensors with. Private to src/optim/.

#include <torchamp/optim.h>

#include "compat/compat.h"

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace torchamp {
namespace optim {

inline bool dense_on(const at::Tensor& t, at::ScalarType dtype, c10::Device device) {
  return t.defined() && t.layout() == at::kStrided && t.device() == device &&
         t.scalar_type() == dtype && t.is_contiguous();
}

inline bool low_precision(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16;
}

// A dense tensor's data, for writing, without data_ptr()'s out-of-line
// checks (the tensor is known dense and, checked before, of a supported dtype).
inline void* data_of(const at::Tensor& t) {
  return compat::dense_data_for_write(*t.unsafeGetTensorImpl());
}

using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = StateMap::key_type;
using ParamState = torch::optim::OptimizerParamState;

// A state's tensors (up to three; undefined where the state has fewer).
using StateTensors = std::array<const at::Tensor*, 3>;

// The float32 master weights of a fused optimizer (its part of the state).
class MasterWeights {
 public:
  explicit MasterWeights(bool on = false);
  ~MasterWeights();
  MasterWeights(const MasterWeights& other) = delete;
  MasterWeights& operator=(const MasterWeights& other) = delete;
  bool on() const { return on_; }
  struct Store;
  Store& store() { return *store_; }
  const Store& store() const { return *store_; }

 private:
  bool on_;
  std::unique_ptr<Store> store_;
};

// The masters by parameter (held, so that its address is not reused while
// the entry lives). bfloat16: an int16 remainder; float16: a float32 copy.
struct MasterWeights::Store {
  struct Entry {
    at::Tensor param;
    at::Tensor master;
  };
  std::unordered_map<const c10::TensorImpl*, Entry> entries;
  uint64_t version = 0;  // bumped by every change of `entries`
};

// A parameter's master weight, made at its first step: exactly the
// parameter's value (a bfloat16 parameter's remainder is zero); its data.
void* make_master(MasterWeights& masters, const at::Tensor& param);

// The archive entry of the master weights (save), and reading and checking
// one against the optimizer, changing nothing (load).
void save_masters(const torch::optim::Optimizer& opt, const MasterWeights& masters,
                  torch::serialize::OutputArchive& archive);
std::unordered_map<const c10::TensorImpl*, MasterWeights::Store::Entry> read_masters(
    const torch::optim::Optimizer& opt, const MasterWeights& masters,
    torch::serialize::InputArchive& archive);

// What is stored for a parameter's master, shared; its float32 value, new.
at::Tensor master_storage(const MasterWeights& masters, const at::Tensor& param);
at::Tensor master_value(const MasterWeights& masters, const at::Tensor& param);

}  // namespace optim
}  // namespace torchamp
