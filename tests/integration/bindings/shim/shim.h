/* The few tensor operations the binding tests need, in C: a stand-in for a
 * binding's own tensor library (tch-rs's torch-sys, TorchSharp's
 * LibTorchSharp), which is where a real program gets its tensors. Handles
 * are at::Tensor*, as in torchamp's C ABI; free each with shim_free. Not
 * part of torchamp. */
#ifndef TORCHAMP_TEST_SHIM_H
#define TORCHAMP_TEST_SHIM_H

#include <torchamp/c/torchamp.h>

#ifdef __cplusplus
extern "C" {
#endif

TORCHAMP_C_API void shim_manual_seed(uint64_t seed);
/* torch::randn({rows, cols}) */
TORCHAMP_C_API torchamp_tensor* shim_randn(int64_t rows, int64_t cols);
/* torch::full({rows, cols}, value, dtype) with requires_grad */
TORCHAMP_C_API torchamp_tensor* shim_full(int64_t rows, int64_t cols, double value, int32_t dtype,
                                          int32_t requires_grad);
/* torch::nn::Linear(in, out)'s parameters, initialised as it does */
TORCHAMP_C_API void shim_linear_init(int64_t in, int64_t out, torchamp_tensor** weight,
                                     torchamp_tensor** bias);
/* torch::nn::functional::linear(x, weight, bias) */
TORCHAMP_C_API torchamp_tensor* shim_linear(const torchamp_tensor* x, const torchamp_tensor* weight,
                                            const torchamp_tensor* bias);
/* mse_loss(out.to(kFloat), y) */
TORCHAMP_C_API torchamp_tensor* shim_mse_loss(const torchamp_tensor* out, const torchamp_tensor* y);
TORCHAMP_C_API void shim_backward(const torchamp_tensor* loss);
TORCHAMP_C_API float shim_item(const torchamp_tensor* scalar);
/* Sets the gradient of a tensor to a copy of `grad`. */
TORCHAMP_C_API void shim_set_grad(torchamp_tensor* param, const torchamp_tensor* grad);
/* The first element of a tensor's gradient, as a double (NaN without one). */
TORCHAMP_C_API double shim_grad_item(const torchamp_tensor* param, int64_t index);
/* The index-th element of a tensor (flattened), as a double. */
TORCHAMP_C_API double shim_value(const torchamp_tensor* tensor, int64_t index);
/* torch::nn::utils::clip_grad_norm_(params, max_norm) */
TORCHAMP_C_API double shim_clip_grad_norm(torchamp_tensor* const* params, size_t count,
                                          double max_norm);
/* The tensor's c10::ScalarType number. */
TORCHAMP_C_API int32_t shim_dtype(const torchamp_tensor* tensor);
TORCHAMP_C_API void shim_free(torchamp_tensor* tensor);

#ifdef __cplusplus
}
#endif

#endif
