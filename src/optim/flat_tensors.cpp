// Tensors laid end to end (see flat_tensors.h).

#include "optim/flat_tensors.h"

#include <ATen/ops/cat.h>

namespace torchamp {
namespace optim {

at::Tensor flat(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> rows;
  rows.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    rows.push_back(t.dim() == 1 ? t : t.reshape({-1}));  // no op where none is needed
  }
  return at::cat(rows);
}

std::vector<at::Tensor> pieces(const at::Tensor& flat, const std::vector<at::Tensor>& like) {
  std::vector<int64_t> numels;
  numels.reserve(like.size());
  for (const at::Tensor& t : like) {
    numels.push_back(t.numel());
  }
  std::vector<at::Tensor> out = flat.split_with_sizes(numels);
  for (size_t i = 0; i < out.size(); ++i) {
    if (like[i].dim() != 1) {  // a 1-D piece has its tensor's shape already
      out[i] = out[i].view(like[i].sizes());
    }
  }
  return out;
}

std::vector<at::Tensor> as_short(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    out.push_back(t.view(at::kShort));
  }
  return out;
}

}  // namespace optim
}  // namespace torchamp
