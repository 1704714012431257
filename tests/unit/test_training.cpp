// GradScaler in real training loops, each against a control run without it
// (behaviour 9 of the core issue). Power-of-two scales make scaling exact, so
// most controls must match bit for bit.
#include <torchamp/autocast.h>
#include <torchamp/grad_scaler.h>

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <limits>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;

torch::nn::Sequential make_model(int64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
}

// Two models with identical weights.
std::pair<torch::nn::Sequential, torch::nn::Sequential> twin_models(int64_t seed) {
  return {make_model(seed), make_model(seed)};
}

std::vector<std::pair<torch::Tensor, torch::Tensor>> batches(int n, int64_t seed) {
  torch::manual_seed(seed);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int i = 0; i < n; ++i) {
    out.emplace_back(torch::randn({4, 8}), torch::randn({4, 8}));
  }
  return out;
}

void expect_same_parameters(const torch::nn::Module& a, const torch::nn::Module& b, double atol) {
  auto pa = a.parameters();
  auto pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(pa[i]).all().item<bool>());
    EXPECT_TRUE(torch::allclose(pa[i], pb[i], /*rtol=*/0.0, atol))
        << "parameter " << i << " differs by " << (pa[i] - pb[i]).abs().max().item<double>();
  }
}

// Two Linear(4, 1) with identical weights (seed 0), as the quickstart's.
std::pair<torch::nn::Linear, torch::nn::Linear> twin_linear() {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 1);
  torch::nn::Linear control(4, 1);
  torch::NoGradGuard g;
  control->weight.copy_(model->weight);
  control->bias.copy_(model->bias);
  return {model, control};
}

// (a) The reference page's loop; a power-of-two scale changes nothing.
TEST(Training, QuickstartLoopMatchesPlainFloat32) {
  auto [model, control] = twin_linear();
  torch::optim::SGD opt(model->parameters(), 0.01);
  torch::optim::SGD copt(control->parameters(), 0.01);
  GradScaler scaler;
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({8, 4});
    auto y = torch::randn({8, 1});
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    EXPECT_TRUE(scaler.step(opt).has_value());
    scaler.update();
    copt.zero_grad();
    torch::mse_loss(control->forward(x), y).backward();
    copt.step();
  }
  expect_same_parameters(*model, *control, 0.0);
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

// (a') The same loop with a bfloat16 autocast forward lands near float32.
TEST(Training, AutocastBFloat16ForwardTracksFloat32) {
  auto [model, control] = twin_linear();
  torch::optim::SGD opt(model->parameters(), 0.05);
  torch::optim::SGD copt(control->parameters(), 0.05);
  GradScaler scaler;
  auto w_true = torch::tensor({{1.0f, -2.0f, 0.5f, 3.0f}});
  for (int i = 0; i < 50; ++i) {
    auto x = torch::randn({16, 4});
    auto y = torch::mm(x, w_true.t());
    opt.zero_grad();
    torch::Tensor out;
    {
      torchamp::autocast guard(torch::kCPU);
      out = model->forward(x);
      ASSERT_EQ(out.scalar_type(), torch::kBFloat16);
    }
    scaler.scale(torch::mse_loss(out.to(torch::kFloat), y)).backward();
    ASSERT_EQ(model->weight.grad().scalar_type(), torch::kFloat);
    scaler.step(opt);
    scaler.update();
    copt.zero_grad();
    torch::mse_loss(control->forward(x), y).backward();
    copt.step();
  }
  EXPECT_TRUE(torch::allclose(model->weight, control->weight, 0.0, 0.05))
      << model->weight << control->weight;
}

// (b) unscale_ -> clip_grad_norm_ -> step == float32 with the same clipping.
TEST(Training, ClippingUnscaledGradientsMatchesFloat32Clipping) {
  auto [model, control] = twin_models(1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  torch::optim::SGD copt(control->parameters(), 0.1);
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  for (auto& [x, y] : batches(5, 2)) {
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    scaler.unscale_(opt);
    const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), 0.05);
    scaler.step(opt);
    scaler.update();
    copt.zero_grad();
    torch::mse_loss(control->forward(x), y).backward();
    const double cnorm = torch::nn::utils::clip_grad_norm_(control->parameters(), 0.05);
    copt.step();
    EXPECT_EQ(norm, cnorm);
    EXPECT_GT(norm, 0.05);  // clipping really happened
  }
  expect_same_parameters(*model, *control, 0.0);
}

// (c) The scenario: init 128, growth_interval 1, inf in the second
// layer's weight gradient at iteration 2 (0-based): 128 -> 256 -> 512 -> 256
// -> 512, parameters as a control that skips iteration 2.
TEST(Training, InjectedInfSkipsExactlyThatStep) {
  auto [model, control] = twin_models(3);
  torch::optim::SGD opt(model->parameters(), 1.0);
  torch::optim::SGD copt(control->parameters(), 1.0);
  GradScaler scaler(GradScalerOptions().init_scale(128).growth_interval(1));
  std::vector<double> scales;
  int it = 0;
  for (auto& [x, y] : batches(4, 4)) {
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    if (it == 2) {
      auto w = model[1]->as<torch::nn::Linear>()->weight;
      w.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    }
    const bool stepped = scaler.step(opt).has_value();
    EXPECT_EQ(stepped, it != 2);
    scaler.update();
    scales.push_back(scaler.get_scale());
    if (it != 2) {
      copt.zero_grad();
      torch::mse_loss(control->forward(x), y).backward();
      copt.step();
    }
    ++it;
  }
  EXPECT_EQ(scales, (std::vector<double>{256, 512, 256, 512}));
  expect_same_parameters(*model, *control, 1e-7);
}

TEST(Training, DisabledScalerIsPlainTraining) {
  auto [model, control] = twin_models(3);
  torch::optim::SGD opt(model->parameters(), 1.0);
  torch::optim::SGD copt(control->parameters(), 1.0);
  GradScaler scaler(GradScalerOptions().init_scale(128).growth_interval(1).enabled(false));
  for (auto& [x, y] : batches(4, 4)) {
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    EXPECT_TRUE(scaler.step(opt).has_value());
    scaler.update();
    copt.zero_grad();
    torch::mse_loss(control->forward(x), y).backward();
    copt.step();
  }
  EXPECT_EQ(scaler.get_scale(), 1.0);
  expect_same_parameters(*model, *control, 1e-7);
}

// (d) Gradient accumulation over 2 micro-batches: 4 micro-batches, 2 steps.
TEST(Training, GradientAccumulationStepsEverySecondMicroBatch) {
  auto [model, control] = twin_models(5);
  torch::optim::SGD opt(model->parameters(), 0.5);
  torch::optim::SGD copt(control->parameters(), 0.5);
  GradScaler scaler(GradScalerOptions().init_scale(128).growth_interval(1));
  const int accumulate = 2;
  int i = 0;
  opt.zero_grad();
  copt.zero_grad();
  for (auto& [x, y] : batches(4, 6)) {
    scaler.scale(torch::mse_loss(model->forward(x), y) / accumulate).backward();
    (torch::mse_loss(control->forward(x), y) / accumulate).backward();
    if (++i % accumulate == 0) {
      EXPECT_TRUE(scaler.step(opt).has_value());
      scaler.update();
      opt.zero_grad();
      copt.step();
      copt.zero_grad();
    }
  }
  EXPECT_EQ(scaler.get_scale(), 512.0);
  expect_same_parameters(*model, *control, 1e-7);
}

// (e) Two optimizers on one scaler, inf in one: only that one is skipped.
TEST(Training, TwoOptimizersOnlyTheOverflowingOneSkips) {
  auto [a, ca] = twin_models(7);
  auto [b, cb] = twin_models(8);
  torch::optim::SGD opt_a(a->parameters(), 0.1);
  torch::optim::Adam opt_b(b->parameters(), torch::optim::AdamOptions(0.01));
  torch::optim::SGD copt_a(ca->parameters(), 0.1);
  GradScaler scaler(GradScalerOptions().init_scale(64));
  auto data = batches(1, 9);
  auto& [x, y] = data[0];
  auto loss = torch::mse_loss(b->forward(a->forward(x)), y);
  scaler.scale(loss).backward();
  b[0]->as<torch::nn::Linear>()->bias.mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(scaler.step(opt_a).has_value());
  EXPECT_FALSE(scaler.step(opt_b).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32.0);

  torch::mse_loss(cb->forward(ca->forward(x)), y).backward();
  copt_a.step();
  expect_same_parameters(*a, *ca, 0.0);
  expect_same_parameters(*b, *cb, 0.0);  // b never stepped
}

// (f) The growth guard: the scale never grows to a non-finite float32.
TEST(Training, GrowthGuardKeepsScaleAt1e38) {
  auto p = torch::zeros({3}, torch::requires_grad());
  torch::optim::SGD opt({p}, 1.0);
  GradScaler scaler(GradScalerOptions().init_scale(1e38).growth_factor(16).growth_interval(1));
  p.mutable_grad() = torch::ones({3});
  EXPECT_TRUE(scaler.step(opt).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(1e38f));
  EXPECT_EQ(scaler.get_growth_tracker(), 0);
}

}  // namespace
