// Paddle's GradScaler document example, in C++: Conv2D(3, 2, 3), SGD,
// init_loss_scaling 1024, autocast forward, scale -> backward -> minimize.
#include <torch/nn/modules/conv.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torchamp/torchamp.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Conv2d model(torch::nn::Conv2dOptions(3, 2, 3).bias(true));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  torchamp::paddle::GradScaler scaler(/*enable=*/true, /*init_loss_scaling=*/1024);
  auto data = torch::rand({10, 3, 32, 32});

  torchamp::autocast guard(torch::kCPU);  // with paddle.amp.auto_cast():
  auto loss = model->forward(data).mean();
  guard.exit();
  auto scaled = scaler.scale(loss);    // scale the loss
  scaled.backward();                   // do backward
  scaler.minimize(optimizer, scaled);  // update parameters
  optimizer.zero_grad();               // optimizer.clear_grad()
  std::cout << "loss " << loss.item<float>() << "  scaled " << scaled.item<float>() << "  scale "
            << scaler.get_scale() << "\n";
}
