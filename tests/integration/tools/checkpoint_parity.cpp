// The C++ half of tests/integration/python/checkpoint_parity.py: one model, one batch,
// trained one step each way with torchamp::checkpoint / checkpoint_sequential
// under bfloat16 autocast with dropout, and the gradients written for Python
// to compare with torch.utils.checkpoint (use_reentrant=True and False) on
// the same parameters, data and seeds.
//
//   checkpoint_parity OUT.pt
//
// OUT is torch::pickle_save({"params": [...], "x": x, "b": b,
// "<case>": [gradients of the parameters..., of x where it requires grad]}).
#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

// The same layers as make_model() in checkpoint_parity.py.
torch::nn::Sequential make_model() {
  torch::manual_seed(11);
  return torch::nn::Sequential(
      torch::nn::Linear(16, 64), torch::nn::GELU(), torch::nn::Dropout(0.25),
      torch::nn::Linear(64, 64), torch::nn::Tanh(), torch::nn::Dropout(0.1),
      torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 8));
}

// None for a parameter without a gradient.
c10::impl::GenericList grads(torch::nn::Sequential& m, const at::Tensor& x) {
  c10::impl::GenericList out(c10::OptionalType::create(c10::TensorType::get()));
  for (const auto& p : m->parameters()) {
    out.push_back(p.grad().defined() ? c10::IValue(p.grad()) : c10::IValue());
  }
  if (x.requires_grad()) {
    out.push_back(x.grad());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: checkpoint_parity OUT.pt\n";
    return 2;
  }
  torch::manual_seed(1);
  const auto x = torch::randn({32, 16});
  const auto b = torch::randn({32, 64});
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  {
    auto m = make_model();
    c10::impl::GenericList params(c10::OptionalType::create(c10::TensorType::get()));
    for (const auto& p : m->parameters()) {
      params.push_back(p.detach().clone());
    }
    out.insert("params", params);
    out.insert("x", x);
    out.insert("b", b);
  }
  // checkpoint_sequential over 3 segments, the input without and with grad,
  // under bfloat16 autocast and in float32.
  for (const bool input_grad : {false, true}) {
    for (const bool amp : {true, false}) {
      auto m = make_model();
      const auto xi = x.clone().requires_grad_(input_grad);
      torch::manual_seed(5);
      at::Tensor y;
      {
        torchamp::autocast guard(torch::kCPU, torch::kBFloat16, amp);
        y = torchamp::checkpoint_sequential(m, 3, xi);
      }
      y.to(torch::kFloat).pow(2).sum().backward();
      out.insert(std::string("sequential") + (amp ? "_bf16" : "_fp32") +
                     (input_grad ? "_grad_input" : "_plain_input"),
                 grads(m, xi));
    }
  }
  // checkpoint(fn, a, b) with two outputs: the first layer and a gate.
  {
    auto m = make_model();
    const auto xi = x.clone().requires_grad_(true);
    auto first = m[0]->as<torch::nn::Linear>();
    torch::manual_seed(5);
    at::Tensor u, v;
    {
      torchamp::autocast guard(torch::kCPU, torch::kBFloat16);
      std::tie(u, v) = torchamp::checkpoint(
          [first](const at::Tensor& a, const at::Tensor& g) {
            const auto h = torch::dropout(first->forward(a), 0.3, true) * g.sigmoid();
            return std::make_tuple(h.tanh(), h.sum(1));
          },
          xi, b);
    }
    (u.to(torch::kFloat).pow(2).sum() + v.to(torch::kFloat).sum()).backward();
    out.insert("function_two_outputs", grads(m, xi));
  }
  const auto bytes = torch::pickle_save(out);
  std::ofstream(argv[1], std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return 0;
}
