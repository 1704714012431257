#pragma once

// Tensors laid end to end, so that ATen ops without a multi-tensor form
// (the bit arithmetic of master weights and stochastic rounding) run once
// for all of a fused call's parameters, not once each: on a GPU a few
// kernels a call, not a few a parameter. Private to src/optim/.

#include <ATen/core/Tensor.h>

#include <vector>

namespace torchamp {
namespace optim {

// The tensors' elements in one new 1-D tensor, in order (one cat; the
// tensors share a dtype and device).
at::Tensor flat(const std::vector<at::Tensor>& tensors);

// Views of a 1-D tensor, one a tensor of `like`, in order, each shaped as it.
std::vector<at::Tensor> pieces(const at::Tensor& flat, const std::vector<at::Tensor>& like);

// The tensors viewed as int16 (16-bit floats' bits).
std::vector<at::Tensor> as_short(const std::vector<at::Tensor>& tensors);

}  // namespace optim
}  // namespace torchamp
