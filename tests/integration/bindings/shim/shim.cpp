// The binding tests' tensor library (shim.h): LibTorch's own C++ calls, the
// ones the C++ quickstart makes, behind a C interface.
#include "shim.h"

#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/utils.h>

#include <limits>
#include <vector>

namespace {
at::Tensor& t(torchamp_tensor* h) {
  return *reinterpret_cast<at::Tensor*>(h);
}
const at::Tensor& t(const torchamp_tensor* h) {
  return *reinterpret_cast<const at::Tensor*>(h);
}
torchamp_tensor* handle(at::Tensor x) {
  return reinterpret_cast<torchamp_tensor*>(new at::Tensor(std::move(x)));
}
}  // namespace

extern "C" {

void shim_manual_seed(uint64_t seed) {
  torch::manual_seed(seed);
}

torchamp_tensor* shim_randn(int64_t rows, int64_t cols) {
  return handle(torch::randn({rows, cols}));
}

torchamp_tensor* shim_full(int64_t rows, int64_t cols, double value, int32_t dtype,
                           int32_t requires_grad) {
  return handle(torch::full({rows, cols}, value,
                            torch::TensorOptions().dtype(static_cast<at::ScalarType>(dtype)))
                    .requires_grad_(requires_grad != 0));
}

void shim_linear_init(int64_t in, int64_t out, torchamp_tensor** weight, torchamp_tensor** bias) {
  torch::nn::Linear linear(in, out);
  *weight = handle(linear->weight);
  *bias = handle(linear->bias);
}

torchamp_tensor* shim_linear(const torchamp_tensor* x, const torchamp_tensor* weight,
                             const torchamp_tensor* bias) {
  return handle(torch::nn::functional::linear(t(x), t(weight), t(bias)));
}

torchamp_tensor* shim_mse_loss(const torchamp_tensor* out, const torchamp_tensor* y) {
  return handle(torch::nn::functional::mse_loss(t(out).to(torch::kFloat), t(y)));
}

void shim_backward(const torchamp_tensor* loss) {
  t(loss).backward();
}

float shim_item(const torchamp_tensor* scalar) {
  return t(scalar).item<float>();
}

void shim_set_grad(torchamp_tensor* param, const torchamp_tensor* grad) {
  t(param).mutable_grad() = t(grad).detach().clone();
}

double shim_grad_item(const torchamp_tensor* param, int64_t index) {
  const at::Tensor& g = t(param).grad();
  if (!g.defined()) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return g.reshape(-1)[index].item<double>();
}

double shim_value(const torchamp_tensor* tensor, int64_t index) {
  return t(tensor).detach().reshape(-1)[index].item<double>();
}

double shim_clip_grad_norm(torchamp_tensor* const* params, size_t count, double max_norm) {
  std::vector<at::Tensor> ps;
  for (size_t i = 0; i < count; ++i) {
    ps.push_back(t(params[i]));
  }
  return torch::nn::utils::clip_grad_norm_(ps, max_norm);
}

int32_t shim_dtype(const torchamp_tensor* tensor) {
  return static_cast<int32_t>(t(tensor).scalar_type());
}

void shim_free(torchamp_tensor* tensor) {
  delete reinterpret_cast<at::Tensor*>(tensor);
}

}  // extern "C"
