// A user's data-parallel training program, built against an installed
// torchamp with find_package (tests/integration/consumer_ddp/CMakeLists.txt) and run
// under torchrun: init_process_group, DistributedDataParallel, GradScaler and
// torchamp's fused AdamW (or, given "libtorch", LibTorch's own AdamW).
// tests/integration/python/consumer_ddp_parity.py runs the same in Python and compares.
//
//   torchrun --nproc-per-node N --no-python consumer OUT_PREFIX [fused|libtorch]
#include <torchamp/torchamp.h>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <ATen/ops/arange.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

// The same numbers in both languages: the same ATen ops on the same inputs.
static torch::Tensor wave(std::vector<int64_t> shape, double freq, double phase, double amp) {
  int64_t n = 1;
  for (auto s : shape) {
    n *= s;
  }
  return at::arange(n, at::kFloat).mul(freq).add(phase).sin().mul(amp).reshape(shape);
}

int main(int argc, char** argv) {
  const std::string optimizer = argc > 2 ? argv[2] : "fused";
  if (argc < 2 || argc > 3 || (optimizer != "fused" && optimizer != "libtorch")) {
    std::cerr << "usage: consumer OUT_PREFIX [fused|libtorch]\n";
    return 2;
  }
  auto group = torchamp::init_process_group();
  const int rank = group->getRank(), world = group->getSize();

  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                              torch::nn::Linear(16, 4));
  {
    torch::NoGradGuard no_grad;
    int i = 0;
    for (auto& p : model->parameters()) {
      p.copy_(wave(p.sizes().vec(), 0.37 + 0.01 * i, 0.1 * i, 0.3));
      ++i;
    }
  }
  torchamp::DistributedDataParallel ddp(model.ptr(), group);
  const auto adamw = torch::optim::AdamWOptions(0.01).weight_decay(0.01);
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (optimizer == "fused") {
    opt = std::make_unique<torchamp::optim::AdamW>(model->parameters(), adamw);
  } else {
    opt = std::make_unique<torch::optim::AdamW>(model->parameters(), adamw);
  }
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(1024).growth_interval(2));

  const int64_t global_batch = 12, per = global_batch / world;
  std::ofstream out(std::string(argv[1]) + "." + std::to_string(rank));
  for (int step = 0; step < 8; ++step) {
    auto x = wave({global_batch, 8}, 0.13, step, 1.0).narrow(0, rank * per, per).clone();
    const auto y = wave({global_batch, 4}, 0.07, 2.0 * step, 1.0).narrow(0, rank * per, per);
    if (step == 3 && rank == world - 1) {
      x[0][0] = INFINITY;  // an overflow on one rank: every rank skips
    }
    const auto pred = ddp.forward([&] { return model->forward(x); });
    scaler.scale(torch::nn::functional::mse_loss(pred, y)).backward();
    scaler.step(*opt);
    scaler.update();
    opt->zero_grad();
    out << "step " << step << " scale " << scaler.get_scale() << "\n";
  }
  for (const auto& p : model->parameters()) {
    const auto flat = p.detach().flatten();
    for (int64_t i = 0; i < flat.numel(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "param %a\n", static_cast<double>(flat[i].item<float>()));
      out << buf;
    }
  }
  std::cout << "rank " << rank << " of " << world << ": done, scale " << scaler.get_scale() << "\n";
  return 0;
}
