// The fused optimizers' other path: ATen's multi-tensor fused ops, which CUDA
// parameters take, forced onto CPU parameters (FusedOptions().aten_kernels)
// so that the CPU checks it. Master weights there are ATen ops around the
// fused call (src/optim/aten_masters.h): torchamp's CPU kernels within
// float32's tolerances through a GradScaler with skipped steps, folded
// clipping and unscale_ (not the same bits: see paths_agree); checkpoints
// moving between the two paths; the join and split on every pattern. That
// the masters there equal a float32 model bit for bit is
// MasterWeights.OnAtensPathEqualAFloat32ModelBitForBitEveryStep.

#include "test_util.h"

#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include "compat/compat.h"       // kAtenFusedOptimizers
#include "optim/aten_masters.h"  // join_bf16_master, split_bf16_master

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;
using torchamp::optim::FusedOptions;

// The float32 (or 16-bit) bits of a tensor as integers, for bit-for-bit
// comparisons that also hold for NaNs.
at::Tensor bits(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return c.element_size() == 4 ? c.view(at::kInt) : c.view(at::kShort);
}

// How far apart two float32 tensors are, in units in the last place.
int64_t max_ulps(const at::Tensor& a, const at::Tensor& b) {
  return (bits(a.to(at::kFloat)).to(at::kLong) - bits(b.to(at::kFloat)).to(at::kLong))
      .abs()
      .max()
      .item<int64_t>();
}

#define SKIP_WITHOUT_ATEN_FUSED_OPS()                                                 \
  if (!torchamp::compat::kAtenFusedOptimizers) {                                      \
    GTEST_SKIP() << "ATen's fused optimizer ops need LibTorch 2.4 or later; this is " \
                 << TORCH_VERSION;                                                    \
  }

std::vector<at::Tensor> make_params(at::ScalarType dtype) {
  torch::manual_seed(7);
  std::vector<at::Tensor> ps;
  for (int64_t n : {1, 33, 1000, 4099}) {
    ps.push_back(torch::randn({n}).to(dtype));
  }
  ps.push_back(torch::randn({20, 30}).to(dtype));
  return ps;
}

// Gradients for step `s` (scaled by `scale`, an inf among them on some
// steps): the same values for every run of a test.
std::vector<at::Tensor> gradients(const std::vector<at::Tensor>& ps, int s, double scale,
                                  at::ScalarType dtype) {
  torch::manual_seed(100 + s);
  std::vector<at::Tensor> gs;
  for (size_t i = 0; i < ps.size(); ++i) {
    at::Tensor g = (torch::randn(ps[i].sizes()) * scale * 1e-2).to(dtype);
    if (s % 23 == 5 && i == 2) {
      g[3] = std::numeric_limits<float>::infinity();
    }
    gs.push_back(g);
  }
  return gs;
}

// One training run: an optimizer of one kind over `ps` with its own
// GradScaler, `kSteps` steps with overflows, clipping every third and
// unscale_ every fifth.
template <class Opt>
struct Training {
  std::vector<at::Tensor> ps;
  Opt opt;
  GradScaler scaler{GradScalerOptions().init_scale(1024).growth_interval(20)};
  template <class Options>
  Training(std::vector<at::Tensor> params, const Options& options, FusedOptions fused)
      : ps(std::move(params)), opt(ps, options, fused) {}
  // Steps with these gradients (converted to each parameter's dtype);
  // returns whether the step was taken.
  bool step(int s, const std::vector<at::Tensor>& gs) {
    for (size_t i = 0; i < ps.size(); ++i) {
      // A copy: the step writes the gradients back unscaled.
      ps[i].mutable_grad() = gs[i].to(ps[i].scalar_type()).clone();
    }
    if (s % 3 == 1) {
      scaler.clip_grad_norm_(opt, 0.5);
    } else if (s % 5 == 2 && ps[0].scalar_type() != at::kHalf) {  // float16: not unscaled
      scaler.unscale_(opt);
    }
    const bool stepped = scaler.step(opt).has_value();
    scaler.update();
    return stepped;
  }
};

constexpr int kSteps = 120;

// ATen's path against torchamp's CPU kernels, from the same start with the
// same gradients: the same skips and scales, and parameters (masters where
// there are) within float32's tolerances (rtol 1.3e-6, atol 1e-5). Not the
// same bits: the two kernels order their float32 arithmetic differently and
// part by an ulp from the first step, as torchamp's kernels do from
// LibTorch's own optimizers; each case's widest gap is printed.
template <class Opt, class Options>
void paths_agree(at::ScalarType dtype, const Options& options, bool masters, const char* what) {
  SCOPED_TRACE(std::string(what) + " " + c10::toString(dtype) +
               (masters ? " with master weights" : ""));
  Training<Opt> own(make_params(dtype), options, FusedOptions().master_weights(masters));
  Training<Opt> aten(make_params(dtype), options,
                     FusedOptions().master_weights(masters).aten_kernels(true));
  ASSERT_TRUE(aten.opt.fused_options().aten_kernels());
  double widest = 0;
  for (int s = 0; s < kSteps; ++s) {
    const auto gs = gradients(own.ps, s, own.scaler.get_scale(), dtype);
    ASSERT_EQ(own.step(s, gs), aten.step(s, gs)) << "step " << s;
    ASSERT_EQ(own.scaler.get_scale(), aten.scaler.get_scale()) << "step " << s;
    for (size_t i = 0; i < own.ps.size(); ++i) {
      const at::Tensor m = masters ? own.opt.master_weight(own.ps[i]) : own.ps[i];
      const at::Tensor n = masters ? aten.opt.master_weight(aten.ps[i]) : aten.ps[i];
      ASSERT_TRUE(torch::allclose(m.to(at::kFloat), n.to(at::kFloat), 1.3e-6, 1e-5))
          << "step " << s << " tensor " << i << ": " << max_ulps(m, n) << " ulps";
      widest = std::max(widest, (m.to(at::kFloat) - n.to(at::kFloat)).abs().max().item<double>());
    }
  }
  std::cout << "[ aten path ] " << what << " " << dtype << (masters ? " masters" : "")
            << ": widest gap from torchamp's kernels over " << kSteps << " steps " << widest
            << "\n";
}

TEST(AtenKernels, StayWithinFloat32TolerancesOfTheCpuKernels) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  paths_agree<torchamp::optim::AdamW>(
      at::kFloat, torch::optim::AdamWOptions(1e-3).weight_decay(0.1), false, "AdamW");
  paths_agree<torchamp::optim::SGD>(at::kFloat, torch::optim::SGDOptions(1e-2).momentum(0.9), false,
                                    "SGD momentum");
  paths_agree<torchamp::optim::AdamW>(at::kBFloat16, torch::optim::AdamWOptions(1e-3), true,
                                      "AdamW");
  paths_agree<torchamp::optim::Adam>(at::kHalf, torch::optim::AdamOptions(1e-3).amsgrad(true), true,
                                     "Adam amsgrad");
}

// A checkpoint moves between the two paths: saved after ATen's steps, it
// loads into an optimizer on torchamp's kernels with the same state
// (masters, remainders, moments, step counts), and the reverse.
TEST(AtenKernels, CheckpointsMoveBetweenThePaths) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  const auto options = torch::optim::AdamWOptions(1e-3);
  const auto masters = FusedOptions().master_weights(true);
  Training<torchamp::optim::AdamW> aten(make_params(at::kBFloat16), options,
                                        FusedOptions(masters).aten_kernels(true));
  for (int s = 0; s < 10; ++s) {
    aten.step(s, gradients(aten.ps, s, aten.scaler.get_scale(), at::kBFloat16));
  }
  std::stringstream saved;
  torch::save(aten.opt, saved);
  Training<torchamp::optim::AdamW> own(aten.ps, options, masters);
  torch::load(own.opt, saved);
  for (const auto& p : aten.ps) {
    EXPECT_TRUE(bits(own.opt.master_weight(p)).equal(bits(aten.opt.master_weight(p))));
    const auto key = torchamp::compat::optim_state_key(own.opt.state(), p);
    const auto& a = static_cast<const torch::optim::AdamWParamState&>(*aten.opt.state().at(key));
    const auto& b = static_cast<const torch::optim::AdamWParamState&>(*own.opt.state().at(key));
    EXPECT_EQ(a.step(), b.step());
    EXPECT_TRUE(bits(a.exp_avg()).equal(bits(b.exp_avg())));
    EXPECT_TRUE(bits(a.exp_avg_sq()).equal(bits(b.exp_avg_sq())));
  }
  // Back: saved from torchamp's kernels, loaded into ATen's path.
  std::stringstream back;
  torch::save(own.opt, back);
  Training<torchamp::optim::AdamW> again(aten.ps, options,
                                         FusedOptions(masters).aten_kernels(true));
  torch::load(again.opt, back);
  for (const auto& p : aten.ps) {
    EXPECT_TRUE(bits(again.opt.master_weight(p)).equal(bits(own.opt.master_weight(p))));
  }
}

// The master's bits from a bfloat16 parameter and its remainder, and back,
// for every parameter pattern and remainders across the int16 range: join is
// (param << 16) + remainder, and split gives back both halves exactly.
TEST(AtenKernels, JoinAndSplitAreTheRemainderSchemeForEveryPattern) {
  const at::Tensor patterns = torch::arange(0, 1 << 16, at::kInt);
  for (int remainder : {0, 1, -1, 0x7fff, -0x8000, 12345, -23456}) {
    const at::Tensor param = patterns.to(at::kShort).view(at::kBFloat16);
    const at::Tensor rem = torch::full({1 << 16}, remainder, at::kShort);
    const at::Tensor master = torchamp::optim::join_bf16_master(param, rem);
    ASSERT_EQ(master.scalar_type(), at::kFloat);
    const at::Tensor expected = (patterns.to(at::kLong) * 65536 + remainder)
                                    .bitwise_and(int64_t{0xffffffff})
                                    .to(at::kInt);  // modulo 2^32, as the kernels' uint32
    ASSERT_TRUE(master.view(at::kInt).equal(expected)) << "remainder " << remainder;
    at::Tensor p2 = torch::zeros({1 << 16}, at::kBFloat16);
    at::Tensor r2 = torch::zeros({1 << 16}, at::kShort);
    torchamp::optim::split_bf16_master(master, p2, r2);
    ASSERT_TRUE(p2.view(at::kShort).equal(param.view(at::kShort))) << "remainder " << remainder;
    ASSERT_TRUE(r2.equal(rem)) << "remainder " << remainder;
  }
}

TEST(AtenKernels, BadOptionsAreTypedErrors) {
  std::vector<at::Tensor> ps = {torch::zeros({4}, at::kBFloat16)};
  if (!torchamp::compat::kAtenFusedOptimizers) {
    torchamp_test::expect_throws<c10::NotImplementedError>(
        [&] {
          torchamp::optim::AdamW(ps, torch::optim::AdamWOptions(),
                                 FusedOptions().aten_kernels(true));
        },
        "LibTorch 2.4 or later");
    return;
  }
  torchamp_test::expect_throws<c10::ValueError>(
      [&] {
        torchamp::optim::AdamW(ps, torch::optim::AdamWOptions(),
                               FusedOptions().aten_kernels(true).stochastic_rounding(true));
      },
      "stochastic rounding is torchamp's CPU kernels only");
}

}  // namespace
