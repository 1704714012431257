#pragma once

// Master weights on the path of ATen's fused ops (CUDA parameters, and CPU
// ones with FusedOptions().aten_kernels): the stored masters joined into
// float32 tensors that ATen's `_fused_*_` updates, and split back after it,
// with ATen ops on the parameters' device. The same bits as the CPU kernels'
// Bf16Master/F16Master (src/kernels/optim_cpu.cpp). Private to src/optim/.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace torchamp {
namespace optim {

// A bfloat16 parameter's float32 master: bits (param << 16) + remainder (a
// new tensor on the parameter's device).
at::Tensor join_bf16_master(const at::Tensor& param, const at::Tensor& remainder);

// A float32 master's bfloat16 parameter and int16 remainder, as int16
// tensors of its shape: the parameter is the high half, plus one where the
// low half is 0x8000 or more; the remainder is the low half (signed).
std::pair<at::Tensor, at::Tensor> split_bf16_bits(const at::Tensor& master);

// The parameters with master weights in one ATen fused call. join() makes
// their float32 masters and gradients as views of flat buffers, a few ops
// for all of them; the call updates those; write_back() writes the
// parameters (and remainders, and unscaled gradients) back, a few ops more.
// On a GPU that is a fixed number of kernels a call, not a few a parameter.
class AtenMasters {
 public:
  // A bfloat16 or float16 parameter, its stored master (an int16 remainder
  // or a float32 copy, of its numel) and its gradient.
  void add(const at::Tensor& param, const at::Tensor& stored, const at::Tensor& grad);

  // The float32 masters and gradients the call takes, in the order added
  // (each shaped as its parameter). A float16 parameter's master is its
  // stored copy itself; the others are new.
  void join();
  const at::Tensor& master(size_t i) const;
  const at::Tensor& grad32(size_t i) const;

  // After the call: the parameters (and remainders) from the masters, and,
  // when the call unscaled (`unscaled`), the gradients rounded back from
  // float32.
  void write_back(bool unscaled) const;

 private:
  // The parameters of one dtype.
  struct Kind {
    std::vector<at::Tensor> params, stored, grads;
    std::vector<at::Tensor> masters, grads32;  // after join()
    at::Tensor flat_master;                    // bfloat16's, after join()
  };
  Kind bf16_, f16_;
  // The i-th added: whether bfloat16, and its index in that kind.
  std::vector<std::pair<bool, size_t>> order_;
  const Kind& kind(size_t i) const { return order_.at(i).first ? bf16_ : f16_; }
};

}  // namespace optim
}  // namespace torchamp
