// torchamp::optim::{SGD, Adam, AdamW}: the fused step against LibTorch's own
// optimizers (every option combination, one step and a thousand), bfloat16
// against float32 math rounded once, checkpoints both ways, and the
// GradScaler integration (check pass, deferred unscale, skips that change
// nothing, unscale_ before step, closures, max_consecutive_skips).
#include "compat/compat.h"
#include "test_util.h"

#include <torchamp/autocast.h>
#include <torchamp/optim.h>
#include <torchamp/paddle.h>

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;

// PyTorch's own float32 tolerances (torch.testing).
constexpr double kRtol = 1.3e-6;
constexpr double kAtol = 1e-5;

std::vector<at::Tensor> make_params(at::ScalarType dtype = at::kFloat, int64_t seed = 0,
                                    c10::Device device = c10::kCPU) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> ps;
  for (int64_t n : {1, 7, 33, 100, 1000, 40000}) {
    ps.push_back(torch::randn({n}).to(device, dtype));
  }
  ps.push_back(torch::randn({20, 30}).to(device, dtype));
  return ps;
}

std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) {
    out.push_back(t.clone());
  }
  return out;
}

void set_grads(std::vector<at::Tensor>& ps, int64_t seed, double scale = 1.0) {
  torch::manual_seed(seed);
  for (auto& p : ps) {
    p.mutable_grad() = (torch::randn(p.sizes()) * scale).to(p.device(), p.scalar_type());
  }
}

void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                  const std::string& what, double rtol = kRtol, double atol = kAtol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].to(at::kDouble), y = b[i].to(at::kDouble);
    EXPECT_TRUE(torch::allclose(x, y, rtol, atol))
        << what << ": tensor " << i << " max diff " << (x - y).abs().max().item<double>();
  }
}

// Every moment tensor of the optimizer, in the state map's order.
template <class State>
std::vector<at::Tensor> adam_state(const torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& kv : opt.state()) {
    const auto& st = static_cast<const State&>(*kv.second);
    out.push_back(st.exp_avg());
    out.push_back(st.exp_avg_sq());
    if (st.max_exp_avg_sq().defined()) {
      out.push_back(st.max_exp_avg_sq());
    }
  }
  return out;
}

// Steps a base and a fused optimizer from identical states and compares
// the parameters (and, through the next steps, the state) after each step.
template <class Base, class Fused, class Options>
void compare_steps(const Options& options, const std::string& what, int steps = 3,
                   c10::Device device = c10::kCPU) {
  auto base_params = make_params(at::kFloat, 0, device);
  auto fused_params = clone_all(base_params);
  Base base(base_params, options);
  Fused fused(fused_params, options);
  for (int s = 0; s < steps; ++s) {
    set_grads(base_params, 100 + s);
    set_grads(fused_params, 100 + s);
    EXPECT_TRUE(fused.supports_amp_scaling()) << what;
    base.step();
    fused.step();
    expect_close(fused_params, base_params, what + " step " + std::to_string(s));
  }
}

void sgd_every_option_combination(c10::Device device) {
  for (double momentum : {0.0, 0.9}) {
    for (double dampening : {0.0, 0.3}) {
      for (bool nesterov : {false, true}) {
        if (nesterov && (momentum == 0 || dampening != 0)) {
          continue;  // LibTorch refuses these
        }
        for (double wd : {0.0, 0.05}) {
          auto o = torch::optim::SGDOptions(0.1)
                       .momentum(momentum)
                       .dampening(dampening)
                       .nesterov(nesterov)
                       .weight_decay(wd);
          compare_steps<torch::optim::SGD, torchamp::optim::SGD>(
              o,
              "SGD momentum " + std::to_string(momentum) + " dampening " +
                  std::to_string(dampening) + " nesterov " + std::to_string(nesterov) + " wd " +
                  std::to_string(wd),
              3, device);
        }
      }
    }
  }
}

void adam_every_option_combination(c10::Device device) {
  for (bool amsgrad : {false, true}) {
    for (double wd : {0.0, 0.05}) {
      for (auto betas : {std::make_tuple(0.9, 0.999), std::make_tuple(0.5, 0.8)}) {
        for (double eps : {1e-8, 1e-3}) {
          const std::string what =
              " amsgrad " + std::to_string(amsgrad) + " wd " + std::to_string(wd) + " beta1 " +
              std::to_string(std::get<0>(betas)) + " eps " + std::to_string(eps);
          compare_steps<torch::optim::Adam, torchamp::optim::Adam>(
              torch::optim::AdamOptions(1e-2).amsgrad(amsgrad).weight_decay(wd).betas(betas).eps(
                  eps),
              "Adam" + what, 3, device);
          compare_steps<torch::optim::AdamW, torchamp::optim::AdamW>(
              torch::optim::AdamWOptions(1e-2).amsgrad(amsgrad).weight_decay(wd).betas(betas).eps(
                  eps),
              "AdamW" + what, 3, device);
        }
      }
    }
  }
}

TEST(FusedOptim, SgdMatchesLibTorchForEveryOptionCombination) {
  sgd_every_option_combination(c10::kCPU);
}

TEST(FusedOptim, AdamAndAdamWMatchLibTorchForEveryOptionCombination) {
  adam_every_option_combination(c10::kCPU);
}

TEST(FusedOptim, ParamGroupsWithTheirOwnOptionsAndFloat64) {
  auto a = make_params(at::kDouble, 1), b = make_params(at::kFloat, 2);
  auto a2 = clone_all(a), b2 = clone_all(b);
  std::vector<torch::optim::OptimizerParamGroup> groups = {
      torch::optim::OptimizerParamGroup(a),
      torch::optim::OptimizerParamGroup(
          b, std::make_unique<torch::optim::AdamWOptions>(
                 torch::optim::AdamWOptions(3e-3).weight_decay(0.2).amsgrad(true)))};
  std::vector<torch::optim::OptimizerParamGroup> groups2 = {
      torch::optim::OptimizerParamGroup(a2),
      torch::optim::OptimizerParamGroup(
          b2, std::make_unique<torch::optim::AdamWOptions>(
                  torch::optim::AdamWOptions(3e-3).weight_decay(0.2).amsgrad(true)))};
  torch::optim::AdamW base(groups, torch::optim::AdamWOptions(1e-2));
  torchamp::optim::AdamW fused(groups2, torch::optim::AdamWOptions(1e-2));
  for (int s = 0; s < 4; ++s) {
    set_grads(a, s);
    set_grads(a2, s);
    set_grads(b, 50 + s);
    set_grads(b2, 50 + s);
    base.step();
    fused.step();
    expect_close(a2, a, "float64 group", 1e-12, 1e-12);
    expect_close(b2, b, "float32 group with its own options");
  }
}

// A small real model, 1,000 steps: the fused optimizers stay within 1e-4
// relative of LibTorch's.
TEST(FusedOptim, ThousandStepsOnASmallModelStayClose) {
  auto run = [](auto make_opt) {
    torch::manual_seed(7);
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                                torch::nn::Linear(32, 4));
    auto opt = make_opt(model->parameters());
    torch::manual_seed(8);
    const auto x = torch::randn({64, 16});
    const auto y = torch::randn({64, 4});
    for (int s = 0; s < 1000; ++s) {
      opt->zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      opt->step();
    }
    return clone_all(model->parameters());
  };
  auto check = [](const std::vector<at::Tensor>& fused, const std::vector<at::Tensor>& base,
                  const char* what) {
    for (size_t i = 0; i < base.size(); ++i) {
      const double rel =
          (fused[i] - base[i]).abs().max().item<double>() / base[i].abs().max().item<double>();
      EXPECT_LE(rel, 1e-4) << what << " tensor " << i;
    }
  };
  check(run([](auto ps) { return std::make_unique<torchamp::optim::AdamW>(ps, 1e-3); }),
        run([](auto ps) { return std::make_unique<torch::optim::AdamW>(ps, 1e-3); }), "AdamW");
  check(run([](auto ps) {
          return std::make_unique<torchamp::optim::Adam>(
              ps, torch::optim::AdamOptions(1e-3).amsgrad(true));
        }),
        run([](auto ps) {
          return std::make_unique<torch::optim::Adam>(
              ps, torch::optim::AdamOptions(1e-3).amsgrad(true));
        }),
        "Adam amsgrad");
  auto sgd = torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true).weight_decay(1e-4);
  check(run([&](auto ps) { return std::make_unique<torchamp::optim::SGD>(ps, sgd); }),
        run([&](auto ps) { return std::make_unique<torch::optim::SGD>(ps, sgd); }), "SGD");
}

// bfloat16 parameters: float32 math on the same values, each stored tensor
// rounded once. The reference is LibTorch's optimizer on float32 copies,
// rounded; float32 rounding differences between the two may move a rounding
// to bfloat16 by one unit, rarely.
TEST(FusedOptim, Bfloat16IsFloat32MathRoundedOnce) {
  auto bf = make_params(at::kBFloat16, 3);
  std::vector<at::Tensor> f32;
  for (const auto& p : bf) {
    f32.push_back(p.to(at::kFloat));
  }
  torchamp::optim::AdamW fused(bf, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  torch::optim::AdamW base(f32, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  set_grads(bf, 9);
  for (size_t i = 0; i < bf.size(); ++i) {
    f32[i].mutable_grad() = bf[i].grad().to(at::kFloat);
  }
  ASSERT_TRUE(fused.supports_amp_scaling());
  fused.step();
  base.step();
  int64_t total = 0, equal = 0;
  for (size_t i = 0; i < bf.size(); ++i) {
    const auto want = f32[i].to(at::kBFloat16);
    total += want.numel();
    equal += bf[i].eq(want).sum().item<int64_t>();
    EXPECT_TRUE(torch::allclose(bf[i].to(at::kFloat), want.to(at::kFloat), 1.0 / 128, 1e-30))
        << "tensor " << i;
  }
  EXPECT_GE(static_cast<double>(equal), 0.999 * static_cast<double>(total))
      << equal << " of " << total << " bit-equal";
}

// Checkpoints: torch::save of one class, torch::load into the other, then
// both continue identically.
template <class Base, class Fused, class Options>
void checkpoint_both_ways(const Options& options, const char* what) {
  const std::string path = ::testing::TempDir() + "torchamp_optim_" + what + ".pt";
  for (bool fused_first : {true, false}) {
    auto p1 = make_params(at::kFloat, 4);
    auto p2 = clone_all(p1);
    std::unique_ptr<torch::optim::Optimizer> first, second;
    if (fused_first) {
      first = std::make_unique<Fused>(p1, options);
      second = std::make_unique<Base>(p2, options);
    } else {
      first = std::make_unique<Base>(p1, options);
      second = std::make_unique<Fused>(p2, options);
    }
    for (int s = 0; s < 3; ++s) {
      set_grads(p1, 20 + s);
      first->step();
    }
    torch::save(*first, path);
    for (size_t i = 0; i < p1.size(); ++i) {
      p2[i].detach().copy_(p1[i]);
    }
    torch::load(*second, path);
    set_grads(p1, 30);
    set_grads(p2, 30);
    first->step();
    second->step();
    expect_close(p2, p1, std::string(what) + (fused_first ? " fused->base" : " base->fused"));
  }
  std::remove(path.c_str());
}

TEST(FusedOptim, CheckpointsMoveBothWaysWithLibTorchsOptimizers) {
  checkpoint_both_ways<torch::optim::SGD, torchamp::optim::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9), "sgd");
  checkpoint_both_ways<torch::optim::Adam, torchamp::optim::Adam>(
      torch::optim::AdamOptions(1e-2).amsgrad(true), "adam");
  checkpoint_both_ways<torch::optim::AdamW, torchamp::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2), "adamw");
}

TEST(FusedOptim, ClosureRunsOnceWithGradModeAndReturnsItsLoss) {
  auto p = torch::ones({3}, torch::requires_grad());
  torchamp::optim::AdamW opt({p}, 0.1);
  int calls = 0;
  auto loss = opt.step([&] {
    ++calls;
    EXPECT_TRUE(at::GradMode::is_enabled());
    opt.zero_grad();
    auto l = (p * p).sum();
    l.backward();
    return l;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(loss.item<float>(), 3.0f);
  EXPECT_TRUE(p.lt(1.0).all().item<bool>());
}

TEST(FusedOptim, NonFusableParametersTakeTheBaseClassStep) {
  auto p = torch::zeros({4});
  p.mutable_grad() = torch::ones({4}, at::kHalf);  // another dtype than the parameter
  torchamp::optim::SGD opt({p}, 0.5);
  EXPECT_FALSE(opt.supports_amp_scaling());
  opt.step();
  EXPECT_TRUE(p.eq(-0.5).all().item<bool>());
}

// ---- with the GradScaler ---------------------------------------------------------

// Scaled training with a fused optimizer and with LibTorch's own: the same
// skip decisions, scales and (within tolerance) parameters; after a fused
// step the gradients are unscaled, equal to those LibTorch's optimizer saw
// (the scale is a power of two); a skipped step changes nothing, gradients
// included.
TEST(FusedScaler, SameDecisionsAsUnscaleThenBaseStepAndSkipsChangeNothing) {
  auto base_params = make_params(at::kFloat, 5);
  auto fused_params = clone_all(base_params);
  torch::optim::AdamW base(base_params, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  torchamp::optim::AdamW fused(fused_params, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  GradScaler s1(GradScalerOptions().init_scale(1024).growth_interval(3));
  GradScaler s2(GradScalerOptions().init_scale(1024).growth_interval(3));
  int64_t ran = 0;
  for (int step = 0; step < 12; ++step) {
    set_grads(base_params, 200 + step, s1.get_scale());
    set_grads(fused_params, 200 + step, s2.get_scale());
    if (step % 4 == 2) {  // an overflow
      base_params[3].mutable_grad()[5] = std::numeric_limits<float>::infinity();
      fused_params[3].mutable_grad()[5] = std::numeric_limits<float>::infinity();
    }
    const auto grads_before = [&] {
      std::vector<at::Tensor> g;
      for (auto& p : fused_params) {
        g.push_back(p.grad().clone());
      }
      return g;
    }();
    const auto params_before = clone_all(fused_params);
    std::vector<at::Tensor> state_before;
    for (auto& t : adam_state<torch::optim::AdamWParamState>(fused)) {
      state_before.push_back(t.clone());
    }
    const auto r1 = s1.step(base);
    const auto r2 = s2.step(fused);
    EXPECT_EQ(r1.has_value(), r2.has_value()) << "step " << step;
    for (size_t i = 0; i < fused_params.size(); ++i) {
      if (r2.has_value()) {  // written back unscaled by the update, as Python's fused optimizers
        EXPECT_TRUE(torch::equal(fused_params[i].grad(), base_params[i].grad())) << "step " << step;
      } else {  // a skipped step writes nothing
        EXPECT_TRUE(torch::equal(fused_params[i].grad(), grads_before[i])) << "step " << step;
      }
    }
    if (!r2.has_value()) {
      for (size_t i = 0; i < fused_params.size(); ++i) {
        EXPECT_TRUE(torch::equal(fused_params[i], params_before[i])) << "skipped step " << step;
      }
      const auto state_after = adam_state<torch::optim::AdamWParamState>(fused);
      ASSERT_EQ(state_after.size(), state_before.size());
      for (size_t i = 0; i < state_after.size(); ++i) {
        EXPECT_TRUE(torch::equal(state_after[i], state_before[i]));
      }
      EXPECT_EQ(s2.non_finite_gradients(fused).size(), 1u);
    }
    ran += r2.has_value() ? 1 : 0;
    for (const auto& kv : fused.state()) {  // step counts: only the steps that ran
      EXPECT_EQ(static_cast<const torch::optim::AdamWParamState&>(*kv.second).step(), ran)
          << "step " << step;
    }
    s1.update();
    s2.update();
    EXPECT_EQ(s1.get_scale(), s2.get_scale());
    expect_close(fused_params, base_params, "step " + std::to_string(step), 1e-5, 1e-5);
  }
}

// PyTorch's test_grad_scaling_autocast_fused_optimizers (test/test_optim.py):
// a model trained with the scaler (init_scale 128) and a fused optimizer, and
// the same model with the non-fused optimizer as control: after every
// scaler.step the fused run's gradients equal the control's (unscaled), the
// losses and parameters agree. The first step's gradients come from identical
// parameters and are compared bit for bit; later ones within PyTorch's 1e-4.
template <class Base, class Fused, class Options>
void fused_gradients_as_pytorch(const Options& options, c10::Device device, const char* what) {
  auto make_model = [&] {
    torch::manual_seed(7);
    torch::nn::Sequential m(torch::nn::Linear(8, 8), torch::nn::ReLU(), torch::nn::Linear(8, 8));
    m->to(device);
    return m;
  };
  auto control = make_model();
  auto scaling = make_model();
  Base opt_control(control->parameters(), options);
  Fused opt_scaling(scaling->parameters(), options);
  GradScaler s_control(GradScalerOptions().init_scale(128.0));
  GradScaler s_scaling(GradScalerOptions().init_scale(128.0));
  torch::manual_seed(8);
  for (int i = 0; i < 4; ++i) {
    const auto input = torch::randn({8, 8}).to(device);
    const auto target = torch::randn({8, 8}).to(device);
    auto train = [&](torch::nn::Sequential& m, torch::optim::Optimizer& opt, GradScaler& s) {
      opt.zero_grad();
      torch::Tensor loss;
      {
        torchamp::autocast guard(device.type());
        loss = torch::mse_loss(m->forward(input).to(torch::kFloat), target);
      }
      s.scale(loss).backward();
      s.step(opt);
      s.update();
      return loss.detach();
    };
    const auto loss_control = train(control, opt_control, s_control);
    ASSERT_TRUE(opt_scaling.supports_amp_scaling()) << what;
    const auto loss_scaling = train(scaling, opt_scaling, s_scaling);
    const std::string at = std::string(what) + " on " + device.str() + " step " + std::to_string(i);
    EXPECT_TRUE(torch::allclose(loss_control, loss_scaling, 1e-4, 1e-4)) << at;
    const auto pc = control->parameters();
    const auto ps = scaling->parameters();
    for (size_t k = 0; k < pc.size(); ++k) {
      if (i == 0) {
        EXPECT_TRUE(torch::equal(pc[k].grad(), ps[k].grad())) << at << " gradient " << k;
      }
      EXPECT_TRUE(torch::allclose(pc[k].grad(), ps[k].grad(), 1e-4, 1e-4))
          << at << " gradient " << k;
      EXPECT_TRUE(torch::allclose(pc[k], ps[k], 1e-4, 1e-4)) << at << " parameter " << k;
    }
  }
}

void fused_gradients_as_pytorch_on(c10::Device device) {
  fused_gradients_as_pytorch<torch::optim::SGD, torchamp::optim::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9), device, "SGD");
  fused_gradients_as_pytorch<torch::optim::Adam, torchamp::optim::Adam>(
      torch::optim::AdamOptions(1e-2), device, "Adam");
  fused_gradients_as_pytorch<torch::optim::AdamW, torchamp::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).amsgrad(true), device, "AdamW");
}

TEST(FusedScaler, GradientsAfterAFusedStepAreUnscaledAsPyTorchs) {
  fused_gradients_as_pytorch_on(c10::kCPU);
}

TEST(FusedScaler, UnscaleBeforeStepIsNotUnscaledTwice) {
  auto base_params = make_params(at::kFloat, 6);
  auto fused_params = clone_all(base_params);
  torch::optim::SGD base(base_params, torch::optim::SGDOptions(0.1).momentum(0.9));
  torchamp::optim::SGD fused(fused_params, torch::optim::SGDOptions(0.1).momentum(0.9));
  GradScaler s1, s2;
  for (int step = 0; step < 3; ++step) {
    set_grads(base_params, 300 + step, s1.get_scale());
    set_grads(fused_params, 300 + step, s2.get_scale());
    s1.unscale_(base);
    s2.unscale_(fused);
    for (size_t i = 0; i < fused_params.size(); ++i) {  // unscaled in place, as any optimizer's
      EXPECT_TRUE(torch::equal(fused_params[i].grad(), base_params[i].grad()));
    }
    torch::nn::utils::clip_grad_norm_(fused_params, 1e9);
    s1.step(base);
    s2.step(fused);
    s1.update();
    s2.update();
    expect_close(fused_params, base_params, "step " + std::to_string(step));
  }
}

TEST(FusedScaler, MaxConsecutiveSkipsAndThePaddleFacade) {
  auto ps = make_params(at::kFloat, 7);
  torchamp::optim::Adam opt(ps, 1e-2);
  GradScaler scaler(GradScalerOptions().max_consecutive_skips(2));
  set_grads(ps, 1);
  ps[0].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(scaler.step(opt).has_value());
  scaler.update();
  torchamp_test::expect_throws<c10::Error>([&] { scaler.step(opt); }, "2 steps in a row");
  EXPECT_TRUE(opt.state().empty());  // no step ran: no state, no step count

  auto qs = make_params(at::kFloat, 8);
  torchamp::optim::SGD sgd(qs, 0.1);
  const auto before = clone_all(qs);
  torchamp::paddle::GradScaler paddle_scaler(true, 1024);
  set_grads(qs, 2, 1024);
  const auto scaled_grads = [&] {
    std::vector<at::Tensor> g;
    for (auto& q : qs) {
      g.push_back(q.grad().clone());
    }
    return g;
  }();
  paddle_scaler.minimize(sgd);
  for (size_t i = 0; i < qs.size(); ++i) {  // p - lr * (g * 1024) / 1024, g written back unscaled
    EXPECT_TRUE(torch::equal(qs[i].grad(), scaled_grads[i] / 1024));
    EXPECT_TRUE(torch::allclose(qs[i], before[i] - 0.1 * qs[i].grad(), kRtol, kAtol));
  }
}

// ---- CUDA: ATen's fused multi-tensor ops ----------------------------------------

// On CUDA the fused step is ATen's _fused_sgd_/_fused_adam_/_fused_adamw_
// (LibTorch 2.4+); below that, the base class's step.
bool cuda_fused_or_skip() {
  if (!torch::cuda::is_available()) {
    return false;
  }
  if (!torchamp::compat::kAtenFusedOptimizers) {
    auto p = torch::zeros({4}, torch::kCUDA);
    p.mutable_grad() = torch::ones({4}, torch::kCUDA);
    torchamp::optim::AdamW opt({p}, 0.1);
    EXPECT_FALSE(opt.supports_amp_scaling());
    return false;
  }
  return true;
}

#define TORCHAMP_REQUIRE_CUDA_FUSED()                                  \
  if (!cuda_fused_or_skip()) {                                         \
    GTEST_SKIP() << "no CUDA device, or a LibTorch without fused ops"; \
  }

TEST(FusedOptimCuda, EveryOptionCombinationMatchesLibTorch) {
  TORCHAMP_REQUIRE_CUDA_FUSED();
  sgd_every_option_combination(c10::kCUDA);
  adam_every_option_combination(c10::kCUDA);
}

// One optimizer over CPU and CUDA parameters, float32 and float64, groups
// with their own options, and parameters whose gradients appear only at the
// second step (new SGD momentum buffers beside old ones, Adam step counts
// that differ within one call).
template <class Base, class Fused, class Options>
void mixed_devices_and_late_gradients(const Options& group_options, const Options& defaults,
                                      const char* what) {
  auto make = [] {
    std::vector<at::Tensor> a = make_params(at::kFloat, 11, c10::kCUDA);
    std::vector<at::Tensor> b = make_params(at::kFloat, 12, c10::kCPU);
    std::vector<at::Tensor> c = make_params(at::kDouble, 13, c10::kCUDA);
    a.insert(a.end(), b.begin(), b.end());
    return std::make_pair(a, c);
  };
  auto [a1, c1] = make();
  auto [a2, c2] = make();
  auto groups = [&](std::vector<at::Tensor>& a, std::vector<at::Tensor>& c) {
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(a);
    g.emplace_back(c, std::make_unique<Options>(group_options));
    return g;
  };
  Base base(groups(a1, c1), defaults);
  Fused fused(groups(a2, c2), defaults);
  for (int s = 0; s < 3; ++s) {
    for (auto* ps : {&a1, &c1, &a2, &c2}) {
      set_grads(*ps, 40 + s);
      if (s == 0) {  // every other parameter starts late
        for (size_t i = 0; i < ps->size(); i += 2) {
          (*ps)[i].mutable_grad() = at::Tensor();
        }
      }
    }
    ASSERT_TRUE(fused.supports_amp_scaling());
    base.step();
    fused.step();
    expect_close(a2, a1, std::string(what) + " float32 CPU+CUDA step " + std::to_string(s));
    expect_close(c2, c1, std::string(what) + " float64 CUDA step " + std::to_string(s), 1e-12,
                 1e-12);
  }
}

TEST(FusedOptimCuda, MixedDevicesGroupsAndLateGradients) {
  TORCHAMP_REQUIRE_CUDA_FUSED();
  mixed_devices_and_late_gradients<torch::optim::SGD, torchamp::optim::SGD>(
      torch::optim::SGDOptions(0.05).momentum(0.8).nesterov(true).weight_decay(0.01),
      torch::optim::SGDOptions(0.1).momentum(0.9).dampening(0.1), "SGD");
  mixed_devices_and_late_gradients<torch::optim::AdamW, torchamp::optim::AdamW>(
      torch::optim::AdamWOptions(3e-3).amsgrad(true).weight_decay(0.2),
      torch::optim::AdamWOptions(1e-2), "AdamW");
  mixed_devices_and_late_gradients<torch::optim::Adam, torchamp::optim::Adam>(
      torch::optim::AdamOptions(3e-3).weight_decay(0.1),
      torch::optim::AdamOptions(1e-2).amsgrad(true), "Adam");
}

// With the scaler on CUDA: the same decisions and scales as LibTorch's
// optimizer after the scaler's unscale; a step that runs leaves the
// gradients unscaled (ATen's kernels write them back, as Python's fused
// optimizers do); a skipped one changes nothing.
template <class Base, class Fused, class Options>
void scaled_on_cuda(const Options& options, const char* what) {
  auto base_params = make_params(at::kFloat, 14, c10::kCUDA);
  auto fused_params = clone_all(base_params);
  Base base(base_params, options);
  Fused fused(fused_params, options);
  GradScaler s1(GradScalerOptions().init_scale(1024).growth_interval(3));
  GradScaler s2(GradScalerOptions().init_scale(1024).growth_interval(3));
  for (int step = 0; step < 10; ++step) {
    set_grads(base_params, 500 + step, s1.get_scale());
    set_grads(fused_params, 500 + step, s2.get_scale());
    if (step % 4 == 1) {
      base_params[4].mutable_grad()[17] = std::numeric_limits<float>::quiet_NaN();
      fused_params[4].mutable_grad()[17] = std::numeric_limits<float>::quiet_NaN();
    }
    ASSERT_TRUE(fused.supports_amp_scaling());
    const auto params_before = clone_all(fused_params);
    std::vector<at::Tensor> grads_before;
    for (auto& p : fused_params) {
      grads_before.push_back(p.grad().clone());
    }
    const auto r1 = s1.step(base);
    const auto r2 = s2.step(fused);
    ASSERT_EQ(r1.has_value(), r2.has_value()) << what << " step " << step;
    for (size_t i = 0; i < fused_params.size(); ++i) {
      if (r2.has_value()) {  // unscaled by a power of two: exactly the scaler's own unscale
        EXPECT_TRUE(torch::equal(fused_params[i].grad(), base_params[i].grad()))
            << what << " step " << step << " gradient " << i;
      } else {
        EXPECT_TRUE(torch::equal(fused_params[i], params_before[i])) << what << " step " << step;
        // bit for bit: the gradient holds a NaN
        EXPECT_TRUE(
            torch::equal(fused_params[i].grad().view(at::kInt), grads_before[i].view(at::kInt)))
            << what << " step " << step;
      }
    }
    s1.update();
    s2.update();
    EXPECT_EQ(s1.get_scale(), s2.get_scale());
    expect_close(fused_params, base_params, std::string(what) + " step " + std::to_string(step));
  }
}

TEST(FusedScalerCuda, GradientsAfterAFusedStepAreUnscaledAsPyTorchs) {
  TORCHAMP_REQUIRE_CUDA_FUSED();
  fused_gradients_as_pytorch_on(c10::kCUDA);
}

TEST(FusedScalerCuda, SameDecisionsUnscaledGradientsAndSkipsChangeNothing) {
  TORCHAMP_REQUIRE_CUDA_FUSED();
  scaled_on_cuda<torch::optim::AdamW, torchamp::optim::AdamW>(
      torch::optim::AdamWOptions(1e-2).amsgrad(true), "AdamW");
  scaled_on_cuda<torch::optim::Adam, torchamp::optim::Adam>(
      torch::optim::AdamOptions(1e-2).weight_decay(0.01), "Adam");
  scaled_on_cuda<torch::optim::SGD, torchamp::optim::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9), "SGD");
}

// The whole recipe on the GPU: float16 autocast forward, scaled backward,
// fused AdamW through the scaler, against LibTorch's AdamW: the same scale
// history, losses within 2% and parameters within 5% (Adam's update is
// nearly scale-free, so the unscale itself is checked by the test above).
TEST(FusedScalerCuda, AutocastFloat16TrainingMatchesLibTorchsAdamW) {
  TORCHAMP_REQUIRE_CUDA_FUSED();
  auto run = [](bool use_fused) {
    torch::manual_seed(21);
    torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::ReLU(),
                                torch::nn::Linear(256, 8));
    model->to(torch::kCUDA);
    std::unique_ptr<torch::optim::Optimizer> opt;
    auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
    if (use_fused) {
      opt = std::make_unique<torchamp::optim::AdamW>(model->parameters(), options);
    } else {
      opt = std::make_unique<torch::optim::AdamW>(model->parameters(), options);
    }
    GradScaler scaler(GradScalerOptions().init_scale(65536.0 * 65536.0).growth_interval(5));
    torch::manual_seed(22);
    const auto x = torch::randn({128, 64}, torch::kCUDA);
    const auto y = torch::randn({128, 8}, torch::kCUDA);
    std::vector<double> scales;
    int skipped = 0;
    double first_loss = 0, last_loss = 0;
    for (int s = 0; s < 60; ++s) {
      opt->zero_grad();
      at::Tensor loss;
      {
        torchamp::autocast guard(torch::kCUDA);
        auto out = model->forward(x);
        EXPECT_EQ(out.scalar_type(), torch::kHalf);
        loss = torch::mse_loss(out.to(torch::kFloat), y);
      }
      scaler.scale(loss).backward();
      skipped += scaler.step(*opt).has_value() ? 0 : 1;
      scaler.update();
      scales.push_back(scaler.get_scale());
      (s == 0 ? first_loss : last_loss) = loss.item<double>();
    }
    EXPECT_GT(skipped, 0) << "the 2^32 start must overflow float16 at first";
    EXPECT_LT(last_loss, first_loss);
    return std::make_tuple(scales, clone_all(model->parameters()), last_loss);
  };
  const auto [fused_scales, fused_params, fused_loss] = run(true);
  const auto [base_scales, base_params, base_loss] = run(false);
  EXPECT_EQ(fused_scales, base_scales);
  EXPECT_NEAR(fused_loss, base_loss, 0.02 * base_loss);
  for (size_t i = 0; i < base_params.size(); ++i) {
    const double rel = (fused_params[i] - base_params[i]).abs().max().item<double>() /
                       base_params[i].abs().max().item<double>();
    // float16 forward passes round nearly equal weights apart now and then,
    // and Adam follows the sign of tiny gradients: the runs drift apart a little
    EXPECT_LE(rel, 5e-2) << "tensor " << i;
  }
}

}  // namespace
