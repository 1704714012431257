// A float16 model trained with float32 master weights: the parameters are
// float16 (half the bytes), the optimizer keeps their float32 masters, the
// scaler protects the float16 gradients, and clipping costs no extra pass.
#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>
#include <torchamp/torchamp.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Linear model(16, 1);
  model->to(torch::kHalf);  // the model itself in float16
  torchamp::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2),
                             torchamp::optim::FusedOptions().master_weights(true));
  torchamp::GradScaler scaler;
  const auto x = torch::randn({256, 16});
  const auto y = x.sum(1, /*keepdim=*/true) * 0.1;
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    // float32 arithmetic on the float16 weights (LibTorch before 2.2 has no
    // float16 matmul on the CPU); the casts give the weights float16 gradients.
    const auto out = torch::nn::functional::linear(x, model->weight.to(torch::kFloat),
                                                   model->bias.to(torch::kFloat));
    const auto loss = torch::nn::functional::mse_loss(out, y);
    scaler.scale(loss).backward();
    scaler.clip_grad_norm_(opt, 1.0);  // the real norm; the clip is folded into the step
    scaler.step(opt);                  // float16 gradients, float32 masters
    scaler.update();
    (step == 0 ? first : last) = loss.item<double>();
  }
  // float32 weights for inference or export: a float32 twin gets the masters
  torch::nn::Linear exported(16, 1);
  opt.export_float32(*model, *exported);
  std::cout << "loss " << first << " -> " << last
            << (last < first / 100 ? " (learned)" : " (did not learn)") << "  weight "
            << model->weight.scalar_type() << "  master "
            << opt.master_weight(model->weight).scalar_type() << "  exported "
            << exported->weight.scalar_type() << "\n";
}
