#pragma once

// nanoGPT's model in the LibTorch C++ frontend: token and position
// embeddings, N pre-LN blocks of causal self-attention and a GELU MLP, a
// final LayerNorm and an output head tied to the token embedding. Parameter
// names are the Python twin's (gpt_python.py), so one state dict fits both.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>

namespace torchamp_gpt {

struct GPTConfig {
  int64_t vocab = 0;
  int64_t context = 256;
  int64_t layers = 6;
  int64_t heads = 6;
  int64_t d_model = 384;
  double dropout = 0.0;            // nanoGPT's default; > 0 takes ATen's math attention
  bool checkpoint_layers = false;  // recompute each block in backward (torchamp::checkpoint)
};

struct BlockImpl : torch::nn::Module {
  BlockImpl(const GPTConfig& c);
  at::Tensor forward(const at::Tensor& x);

  int64_t heads;
  double dropout;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  torch::nn::Linear attn_in{nullptr}, attn_out{nullptr}, fc{nullptr}, proj{nullptr};
  torch::nn::Dropout resid_drop{nullptr}, mlp_drop{nullptr};

 private:
  at::Tensor attention(const at::Tensor& x);
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  explicit GPTImpl(const GPTConfig& c);
  /// Logits (batch, time, vocab) of `idx` (batch, time) token ids.
  at::Tensor forward(const at::Tensor& idx);
  /// nanoGPT's initialisation from the current RNG: N(0, 0.02) weights, zero
  /// biases, the residual projections N(0, 0.02 / sqrt(2 * layers)).
  void init_weights();
  /// Continues `prompt` (1, t) by `n` tokens, sampled at `temperature`.
  at::Tensor generate(at::Tensor prompt, int64_t n, double temperature);

  GPTConfig config;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace torchamp_gpt
