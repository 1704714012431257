#pragma once

// Master weights on the path of ATen's fused ops (CUDA parameters, and CPU
// ones with FusedOptions().aten_kernels): the stored master joined into a
// float32 tensor that ATen's `_fused_*_` updates, and split back after it,
// with ATen ops on the parameter's device. The same bits as the CPU kernels'
// Bf16Master/F16Master (src/kernels/optim_cpu.cpp). Private to src/optim/.

#include <ATen/core/Tensor.h>

namespace torchamp {
namespace optim {

// A bfloat16 parameter's float32 master: bits (param << 16) + remainder (a
// new tensor on the parameter's device).
at::Tensor join_bf16_master(const at::Tensor& param, const at::Tensor& remainder);

// Writes a float32 master back as its bfloat16 parameter and int16
// remainder: the parameter is the high half, plus one where the low half is
// 0x8000 or more; the remainder is the low half (signed).
void split_bf16_master(const at::Tensor& master, const at::Tensor& param,
                       const at::Tensor& remainder);

// One parameter's share of an ATen fused call with master weights: the
// float32 tensors the call updates, and what to write back after it.
struct AtenMaster {
  at::Tensor param;   // bfloat16 or float16
  at::Tensor stored;  // the store's master: int16 remainder or float32 copy
  at::Tensor master;  // float32: joined (bfloat16) or `stored` itself (float16)
  at::Tensor grad;    // the parameter's gradient
  at::Tensor grad32;  // the gradient in float32, which the call unscales
};

AtenMaster aten_master(const at::Tensor& param, const at::Tensor& stored, const at::Tensor& grad);

// After the call: the parameter (and remainder) from the master, and, when
// the call unscaled (`unscaled`), the gradient rounded back from float32.
void write_back(const AtenMaster& m, bool unscaled);

}  // namespace optim
}  // namespace torchamp
