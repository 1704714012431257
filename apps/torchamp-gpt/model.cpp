#include "model.h"

#include <torchamp/checkpoint.h>

#include <ATen/ATen.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/version.h>

#include <cmath>

namespace torchamp_gpt {

namespace {

// Causal attention over (batch, heads, time, head_dim) tensors. LibTorch 2.x
// has ATen's fused kernel (flash attention on CPU), Python's
// F.scaled_dot_product_attention(is_causal=True); LibTorch 1.13 the same
// arithmetic op by op.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, /*is_causal=*/true);
#else
  const int64_t t = q.size(-2);
  auto att = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  const auto mask = at::ones({t, t}, q.options().dtype(at::kBool)).triu(1);
  att = at::softmax(att.masked_fill(mask, -INFINITY), -1);
  att = at::dropout(att, dropout, dropout > 0);
  return at::matmul(att, v);
#endif
}

// Python's nn.Linear: ATen's linear, which folds a (batch, time, d) input
// into one addmm with the bias. LibTorch's torch::nn::Linear::forward
// (torch::nn::functional::linear) does that only for 2-D inputs; on 3-D ones
// it runs a matmul and then adds the bias in place, one more pass over every
// output in forward and a sum in backward (docs/gpt.md: 7% of a bf16 step).
at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return at::linear(x, layer->weight, layer->bias);
}

}  // namespace

BlockImpl::BlockImpl(const GPTConfig& c) : heads(c.heads), dropout(c.dropout) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  attn_in = register_module("attn_in", torch::nn::Linear(c.d_model, 3 * c.d_model));
  attn_out = register_module("attn_out", torch::nn::Linear(c.d_model, c.d_model));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  fc = register_module("fc", torch::nn::Linear(c.d_model, 4 * c.d_model));
  proj = register_module("proj", torch::nn::Linear(4 * c.d_model, c.d_model));
  resid_drop = register_module("resid_drop", torch::nn::Dropout(c.dropout));
  mlp_drop = register_module("mlp_drop", torch::nn::Dropout(c.dropout));
}

at::Tensor BlockImpl::attention(const at::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  auto qkv = linear(attn_in, x).split(d, 2);
  auto heads_of = [&](const at::Tensor& y) {
    return y.view({b, t, heads, d / heads}).transpose(1, 2);
  };
  auto y = causal_attention(heads_of(qkv[0]), heads_of(qkv[1]), heads_of(qkv[2]),
                            is_training() ? dropout : 0.0);
  y = y.transpose(1, 2).contiguous().view({b, t, d});
  return resid_drop->forward(linear(attn_out, y));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  auto h = x + attention(ln_1->forward(x));
  auto m = linear(proj, torch::nn::functional::gelu(linear(fc, ln_2->forward(h))));
  return h + mlp_drop->forward(m);
}

GPTImpl::GPTImpl(const GPTConfig& c) : config(c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.d_model));
  wpe = register_module("wpe", torch::nn::Embedding(c.context, c.d_model));
  drop = register_module("drop", torch::nn::Dropout(c.dropout));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    blocks->push_back(Block(c));
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  init_weights();
}

void GPTImpl::init_weights() {
  torch::NoGradGuard no_grad;
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.layers));
  for (const auto& item : named_parameters()) {
    const auto& name = item.key();
    auto p = item.value();
    const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (name.find("ln_") != std::string::npos) {
      bias ? p.zero_() : p.fill_(1.0);
    } else if (bias) {
      p.zero_();
    } else {
      const bool resid = name.find("attn_out.weight") != std::string::npos ||
                         name.find("proj.weight") != std::string::npos;
      p.normal_(0.0, resid ? resid_std : 0.02);
    }
  }
}

at::Tensor GPTImpl::forward(const at::Tensor& idx) {
  const int64_t t = idx.size(1);
  const auto pos = at::arange(t, idx.options().dtype(at::kLong));
  auto x = drop->forward(wte->forward(idx) + wpe->forward(pos));
  for (const auto& module : *blocks) {
    auto block = std::dynamic_pointer_cast<BlockImpl>(module);
    if (config.checkpoint_layers && is_training()) {
      x = torchamp::checkpoint([block](const at::Tensor& h) { return block->forward(h); }, x);
    } else {
      x = block->forward(x);
    }
  }
  // The head is the token embedding's transpose (nanoGPT's weight tying).
  return at::linear(ln_f->forward(x), wte->weight);
}

at::Tensor GPTImpl::generate(at::Tensor prompt, int64_t n, double temperature) {
  torch::NoGradGuard no_grad;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = prompt.size(1);
    const auto window = prompt.slice(1, std::max<int64_t>(0, t - config.context), t);
    auto logits = forward(window).select(1, window.size(1) - 1).to(at::kFloat) / temperature;
    auto next = at::multinomial(at::softmax(logits, -1), 1);
    prompt = at::cat({prompt, next}, 1);
  }
  return prompt;
}

}  // namespace torchamp_gpt
