// The reference page's example in C++: a linear model trained with mixed
// precision (autocast forward, scaled loss, skipped steps on inf/NaN), then one
// iteration that clips the real (unscaled) gradients before stepping.
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torchamp/torchamp.h>

#include <iostream>
#include <utility>
#include <vector>

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  torch::nn::Linear model(4, 1);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> dataloader;
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({8, 4}, device);  // x first: arguments have no evaluation order
    dataloader.emplace_back(x, torch::randn({8, 1}, device));
  }

  torchamp::GradScaler scaler;  // 2^16, x2 every 2000 clean steps, x0.5 on inf/NaN
  for (auto& [x, y] : dataloader) {
    optimizer.zero_grad();
    torchamp::autocast guard(device);  // float16 on CUDA, bfloat16 on CPU
    auto out = model->forward(x);
    guard.exit();  // the end of Python's `with torch.autocast(...):` block
    auto loss = torch::nn::functional::mse_loss(out.to(torch::kFloat), y);
    scaler.scale(loss).backward();
    scaler.step(optimizer);  // skipped if a gradient is inf/NaN
    scaler.update();         // grow or back off the scale
    std::cout << "loss " << loss.item<float>() << "  scale " << scaler.get_scale() << "\n";
  }

  // Clipping the unscaled gradients: step() sees that unscale_() already ran.
  auto& [x, y] = dataloader[0];
  optimizer.zero_grad();
  scaler.scale(torch::nn::functional::mse_loss(model->forward(x), y)).backward();
  scaler.unscale_(optimizer);
  const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
  scaler.step(optimizer);
  scaler.update();
  std::cout << "clipped gradient norm " << norm << "  scale " << scaler.get_scale() << "\n";
}
