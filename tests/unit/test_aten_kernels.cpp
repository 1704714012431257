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

#include "compat/compat.h"          // kAtenFusedOptimizers
#include "kernels/bf16.h"           // noise32, float_to_bf16_stochastic
#include "kernels/optim_kernels.h"  // rounding_key
#include "optim/aten_masters.h"     // join_bf16_master, split_bf16_bits
#include "optim/aten_rounding.h"    // rounding_keys, aten_noise, rounding_layout, stochastic_bits
#include "optim/updates.h"          // set_call_elements

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
  GradScaler scaler;
  template <class Options>
  Training(std::vector<at::Tensor> params, const Options& options, FusedOptions fused,
           GradScalerOptions scaling = GradScalerOptions().init_scale(1024).growth_interval(20))
      : ps(std::move(params)), opt(ps, options, fused), scaler(scaling) {}
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
// same bits: the two kernels order their float32 arithmetic differently (as
// torchamp's kernels do from LibTorch's own optimizers): Adam's agree after
// the first step and SGD's part by an ulp; each case's widest gap is
// printed, absolute and in ulps.
template <class Opt, class Options>
void paths_agree(at::ScalarType dtype, const Options& options, bool masters, const char* what) {
  SCOPED_TRACE(std::string(what) + " " + c10::toString(dtype) +
               (masters ? " with master weights" : ""));
  Training<Opt> own(make_params(dtype), options, FusedOptions().master_weights(masters));
  Training<Opt> aten(make_params(dtype), options,
                     FusedOptions().master_weights(masters).aten_kernels(true));
  ASSERT_TRUE(aten.opt.fused_options().aten_kernels());
  double widest = 0;
  int64_t widest_ulps = 0, first_step_ulps = 0;
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
      // In ulps where the values are not near 0 (there an absolute gap of
      // 1e-7 is millions of ulps of a tiny value).
      const at::Tensor away = m.to(at::kFloat).abs().ge(1e-3);
      const int64_t ulps = away.any().item<bool>() ? max_ulps(m.to(at::kFloat).masked_select(away),
                                                              n.to(at::kFloat).masked_select(away))
                                                   : 0;  // max() of nothing would throw
      widest_ulps = std::max(widest_ulps, ulps);
      if (s == 0) {
        first_step_ulps = std::max(first_step_ulps, ulps);
      }
    }
  }
  std::cout << "[ aten path ] " << what << " " << dtype << (masters ? " masters" : "")
            << ": widest gap from torchamp's kernels over " << kSteps << " steps " << widest << " ("
            << widest_ulps << " float32 ulps where |x| >= 1e-3; after the first step "
            << first_step_ulps << ")"
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

// Master weights and stochastic rounding on ATen's path are a fixed number
// of operators a fused call, not a few a parameter (on a GPU each is a
// kernel launch): the float32 copies of the parameters (bfloat16 and
// float16), gradients and state joined in flat buffers, their bits and the
// noise made once, and the results copied back with multi-tensor copies.
// Counted in a scaler's step that unscales (the gradients written back),
// with a host and a device scaler, for 4 and 40 parameters, views (no
// kernel) not counted.
TEST(AtenKernels, MastersAndRoundingAreNoOperatorAParameter) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  const auto ops_for = [](const FusedOptions& fused, bool device_state, int n) {
    torch::manual_seed(3);
    std::vector<at::Tensor> ps;
    for (int i = 0; i < n; ++i) {
      const bool half = i % 2 == 1 && !fused.stochastic_rounding();  // rounding: bfloat16 only
      ps.push_back(torch::randn({3, 5}).to(half ? at::kHalf : at::kBFloat16));
    }
    torchamp::optim::AdamW opt(ps, torch::optim::AdamWOptions(1e-3).amsgrad(true),
                               FusedOptions(fused).aten_kernels(true));
    GradScaler scaler(GradScalerOptions().init_scale(4).device_state(device_state));
    const auto set_grads = [&] {
      for (const auto& p : ps) {
        p.mutable_grad() = torch::full(p.sizes(), 4.0, p.options());
      }
    };
    set_grads();
    scaler.step(opt);  // the state and the scaler's tensors made before counting
    scaler.update();
    set_grads();
    const at::Tensor before = ps[0].clone();
    torchamp_test::TopLevelOps ops(/*kernels_only=*/true);
    scaler.step(opt);
    const int count = ops.count();
    EXPECT_FALSE(ps[0].equal(before)) << "the step did not update";
    EXPECT_TRUE(ps[1].grad().eq(1.0).all().item<bool>()) << "the gradient was not unscaled";
    return count;
  };
  for (const bool device_state : {false, true}) {
    for (const auto& fused :
         {FusedOptions().master_weights(true), FusedOptions().stochastic_rounding(true).seed(5)}) {
      const char* what = fused.master_weights() ? "master weights" : "stochastic rounding";
      SCOPED_TRACE(std::string(what) + (device_state ? ", device scaler" : ", host scaler"));
      const int few = ops_for(fused, device_state, 4), many = ops_for(fused, device_state, 40);
      std::cout << "[ aten path ] a step with " << what
                << (device_state ? " (device scaler): " : " (host scaler): ") << few
                << " operators for 4 parameters, " << many << " for 40 (views not counted)\n";
      EXPECT_EQ(many, few);
    }
  }
}

// A fused call on ATen's path takes at most so many elements (their flat
// buffers' temporaries bounded on a large model); more parameters make more
// calls. The same bits either way: each parameter's update, master and
// noise are its own. Parts of 1,000 elements (the 4,099-element tensor a
// part alone) against one call, 30 steps with skips, clipping and unscale_.
template <class Opt, class Options>
void parts_change_nothing(const Options& options, const FusedOptions& fused, at::ScalarType dtype,
                          const char* what) {
  SCOPED_TRACE(what);
  struct Parts {  // the limit for a scope, put back after it
    int64_t was = torchamp::optim::call_elements();
    explicit Parts(int64_t n) { torchamp::optim::set_call_elements(n); }
    ~Parts() { torchamp::optim::set_call_elements(was); }
  };
  const auto aten = FusedOptions(fused).aten_kernels(true);
  Training<Opt> whole(make_params(dtype), options, aten);
  Training<Opt> parts(make_params(dtype), options, aten);
  int whole_ops = 0, parts_ops = 0;  // the operators of all steps: more calls
  for (int s = 0; s < 30; ++s) {
    const auto gs = gradients(whole.ps, s, whole.scaler.get_scale(), dtype);
    bool stepped = false;
    {
      torchamp_test::TopLevelOps ops(/*kernels_only=*/true);
      stepped = whole.step(s, gs);
      whole_ops += ops.count();
    }
    {
      Parts limit(1000);
      torchamp_test::TopLevelOps ops(/*kernels_only=*/true);
      ASSERT_EQ(parts.step(s, gs), stepped) << "step " << s;
      parts_ops += ops.count();
    }
    for (size_t i = 0; i < whole.ps.size(); ++i) {
      ASSERT_TRUE(bits(whole.ps[i]).equal(bits(parts.ps[i]))) << "step " << s << " tensor " << i;
      if (fused.master_weights()) {
        ASSERT_TRUE(bits(whole.opt.master_weight(whole.ps[i]))
                        .equal(bits(parts.opt.master_weight(parts.ps[i]))))
            << "step " << s << " tensor " << i;
      }
    }
  }
  EXPECT_GT(parts_ops, whole_ops) << "no more calls in parts";
}

TEST(AtenKernels, CallsSplitIntoPartsGiveTheSameBits) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  const auto adam = torch::optim::AdamOptions(1e-3).amsgrad(true);
  const auto sgd = torch::optim::SGDOptions(1e-2).momentum(0.9);
  const auto masters = FusedOptions().master_weights(true);
  const auto sr = FusedOptions().stochastic_rounding(true).seed(9);
  parts_change_nothing<torchamp::optim::Adam>(adam, masters, at::kBFloat16, "Adam bf16 masters");
  parts_change_nothing<torchamp::optim::SGD>(sgd, masters, at::kHalf, "SGD fp16 masters");
  parts_change_nothing<torchamp::optim::Adam>(adam, sr, at::kBFloat16, "Adam rounding");
  parts_change_nothing<torchamp::optim::SGD>(sgd, sr, at::kBFloat16, "SGD rounding");
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
    const auto halves = torchamp::optim::split_bf16_bits(master);
    ASSERT_TRUE(halves.first.equal(param.view(at::kShort))) << "remainder " << remainder;
    ASSERT_TRUE(halves.second.equal(rem)) << "remainder " << remainder;
  }
}

// Stochastic rounding's ATen ops are the CPU kernels' arithmetic: the keys
// (from a host count, and from a count in a tensor), each element's noise,
// and the rounding of every kind of float32 value.
TEST(AtenKernels, StochasticRoundingOpsAreTheKernelsArithmetic) {
  // One parameter's noise under key `flat` of `keys`, alone (on the CPU).
  const auto noise_of = [](const torchamp::optim::RoundingKeys& keys, int64_t flat, int64_t numel) {
    return torchamp::optim::aten_noise(
        keys, torchamp::optim::rounding_layout({flat}, {numel}, at::kCPU), numel, 2);
  };
  namespace k = torchamp::kernels;
  using torchamp::optim::RoundingKeys;
  for (const uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0} - 3}) {
    for (const uint64_t update : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 40, ~uint64_t{0}}) {
      const RoundingKeys host = torchamp::optim::rounding_keys(seed, update, 9);
      const RoundingKeys device = torchamp::optim::rounding_keys(
          seed, torch::full({}, static_cast<int64_t>(update), at::kLong), 9);
      for (int64_t i = 0; i < 9; ++i) {
        const uint64_t key = k::rounding_key(seed, update, static_cast<uint64_t>(i));
        ASSERT_EQ(static_cast<uint32_t>(host.low[i].item<int32_t>()), static_cast<uint32_t>(key));
        ASSERT_EQ(static_cast<uint32_t>(host.high[i].item<int32_t>()),
                  static_cast<uint32_t>(key >> 32));
        ASSERT_TRUE(device.low[i].equal(host.low[i])) << seed << " " << update << " " << i;
        ASSERT_TRUE(device.high[i].equal(host.high[i])) << seed << " " << update << " " << i;
      }
    }
  }
  const RoundingKeys keys = torchamp::optim::rounding_keys(11, 5, 3);
  const int64_t n = 70000;
  const auto noise = noise_of(keys, 2, n);
  const auto k0 = static_cast<uint32_t>(keys.low[2].item<int32_t>());
  const auto k1 = static_cast<uint32_t>(keys.high[2].item<int32_t>());
  const auto* np = noise.param.data_ptr<int32_t>();
  const auto* n0 = noise.state0.data_ptr<int32_t>();
  const auto* n1 = noise.state1.data_ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = k::noise32(static_cast<uint32_t>(i), k0);
    const uint32_t b = k::noise32(static_cast<uint32_t>(i), k1);
    ASSERT_EQ(static_cast<uint32_t>(np[i]), a & 0xffffu) << i;
    ASSERT_EQ(static_cast<uint32_t>(n0[i]), a >> 16) << i;
    ASSERT_EQ(static_cast<uint32_t>(n1[i]), b & 0xffffu) << i;
  }
  // Several parameters laid end to end, their keys in any order: each
  // element's noise is its parameter's alone (one of them empty).
  const RoundingKeys four = torchamp::optim::rounding_keys(11, 5, 4);
  const std::vector<int64_t> flats{2, 0, 3, 1}, numels{5, 0, n, 3};
  const auto joint = torchamp::optim::aten_noise(
      four, torchamp::optim::rounding_layout(flats, numels, at::kCPU), n + 8, 2);
  std::vector<at::Tensor> alone[3];
  for (size_t j = 0; j < flats.size(); ++j) {
    const auto one = noise_of(four, flats[j], numels[j]);
    alone[0].push_back(one.param);
    alone[1].push_back(one.state0);
    alone[2].push_back(one.state1);
  }
  ASSERT_TRUE(joint.param.equal(torch::cat(alone[0])));
  ASSERT_TRUE(joint.state0.equal(torch::cat(alone[1])));
  ASSERT_TRUE(joint.state1.equal(torch::cat(alone[2])));
  // Every bfloat16 pattern with low bits of each kind (NaNs, infinities,
  // subnormals and the largest finite values among them), under that noise.
  at::Tensor values = torch::arange(0, 1 << 16, at::kInt).mul_(1 << 16);
  values = torch::cat({values, values.add(1), values.add(0x7fff), values.add(0x8000),
                       values.add(0xffff), values.add(0x1234)})
               .view(at::kFloat);
  const auto m = values.numel();
  const auto wide = noise_of(keys, 0, m);
  const at::Tensor rounded = torchamp::optim::stochastic_bits(values, wide.state1);
  const auto* v = values.data_ptr<float>();
  const auto* w = wide.state1.data_ptr<int32_t>();
  const auto* r = static_cast<const uint16_t*>(rounded.data_ptr());
  for (int64_t i = 0; i < m; ++i) {
    ASSERT_EQ(r[i], k::float_to_bf16_stochastic(v[i], static_cast<uint32_t>(w[i]))) << i;
  }
}

// Stochastic rounding on ATen's path against torchamp's CPU kernels, from
// the same start with the same gradients through a GradScaler (skips,
// clipping, unscale_): the same noise, so the same bits wherever the two
// float32 updates agree (they part by an ulp now and then, as in
// paths_agree, and an element whose update straddles a rounding edge then
// differs by a bfloat16 step).
template <class Opt, class Options>
void rounding_paths_agree(const Options& options, const char* what,
                          FusedOptions sr = FusedOptions().stochastic_rounding(true).seed(3)) {
  SCOPED_TRACE(what);
  Training<Opt> own(make_params(at::kBFloat16), options, sr);
  Training<Opt> aten(make_params(at::kBFloat16), options, FusedOptions(sr).aten_kernels(true));
  int64_t differ = 0, total = 0, widest = 0;
  for (int s = 0; s < 40; ++s) {
    const auto gs = gradients(own.ps, s, own.scaler.get_scale(), at::kBFloat16);
    ASSERT_EQ(own.step(s, gs), aten.step(s, gs)) << "step " << s;
    ASSERT_EQ(own.scaler.get_scale(), aten.scaler.get_scale()) << "step " << s;
  }
  for (size_t i = 0; i < own.ps.size(); ++i) {
    const at::Tensor gap = (bits(own.ps[i]).to(at::kInt) - bits(aten.ps[i]).to(at::kInt)).abs_();
    differ += gap.ne(0).sum().item<int64_t>();
    total += gap.numel();
    widest = std::max(widest, gap.max().item<int64_t>());
  }
  // The state too, tensor by tensor (each rounds with its own noise: the
  // first state tensor's, then the second's, AMSGrad's max the second's):
  // elements that differ, where the same noise would give the same bits.
  int64_t state_differ = 0, state_total = 0;
  for (size_t i = 0; i < own.ps.size(); ++i) {
    const auto tensors = [&](const Training<Opt>& t) {
      const auto& st = *t.opt.state().at(torchamp::compat::optim_state_key(t.opt.state(), t.ps[i]));
      std::vector<at::Tensor> out;
      if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&st)) {
        out.push_back(sgd->momentum_buffer());
      } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(&st)) {
        out = {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()};
      } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) {
        out = {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()};
      }
      return out;
    };
    const std::vector<at::Tensor> a = tensors(own), b = tensors(aten);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      ASSERT_EQ(a[k].defined(), b[k].defined()) << "tensor " << i << " state " << k;
      if (a[k].defined() && a[k].scalar_type() == at::kBFloat16) {  // float32: no rounding
        state_differ += bits(a[k]).ne(bits(b[k])).sum().item<int64_t>();
        state_total += a[k].numel();
      }
    }
  }
  std::cout << "[ aten path ] " << what << " stochastic rounding: " << differ << " of " << total
            << " parameter elements differ from torchamp's kernels after 40 steps, by at most "
            << widest << " bfloat16 steps; " << state_differ << " of " << state_total
            << " state elements differ\n";
  EXPECT_LE(widest, 2);
  EXPECT_LE(differ * 100, total);              // under 1%
  EXPECT_LE(state_differ * 100, state_total);  // under 1%
}

TEST(AtenKernels, StochasticRoundingAgreesWithTheCpuKernels) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  rounding_paths_agree<torchamp::optim::AdamW>(torch::optim::AdamWOptions(1e-3).weight_decay(0.1),
                                               "AdamW");
  rounding_paths_agree<torchamp::optim::Adam>(torch::optim::AdamOptions(1e-3).amsgrad(true),
                                              "Adam amsgrad");
  rounding_paths_agree<torchamp::optim::SGD>(torch::optim::SGDOptions(1e-2).momentum(0.9),
                                             "SGD momentum");
  rounding_paths_agree<torchamp::optim::AdamW>(
      torch::optim::AdamWOptions(1e-3).weight_decay(0.1), "AdamW float32 state",
      FusedOptions().stochastic_rounding(true).seed(3).state_dtype(at::kFloat));
}

// Under a scaler whose state is in tensors (a CUDA scaler's way; here on the
// CPU with device_state), the flag is not read back: the rounding count stays
// in a tensor, skipped steps leave it (and every bit) as they were, and
// save() brings it to the host. The run equals the same run under a host
// scaler bit for bit, archives included, and a loaded archive goes on alike.
TEST(AtenKernels, StochasticRoundingUnderADeviceFlagKeepsItsCountOnTheDevice) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  const auto sr = FusedOptions().stochastic_rounding(true).seed(5).aten_kernels(true);
  const auto scaling = GradScalerOptions().init_scale(1024).growth_interval(20);
  Training<torchamp::optim::AdamW> host(make_params(at::kBFloat16), options, sr, scaling);
  Training<torchamp::optim::AdamW> device(make_params(at::kBFloat16), options, sr,
                                          GradScalerOptions(scaling).device_state(true));
  int skipped = 0;
  const auto run = [&](int from, int to) {
    for (int s = from; s < to; ++s) {
      const auto gs = gradients(host.ps, s, host.scaler.get_scale(), at::kBFloat16);
      skipped += host.step(s, gs) ? 0 : 1;
      device.step(s, gs);
      for (size_t i = 0; i < host.ps.size(); ++i) {
        ASSERT_TRUE(bits(host.ps[i]).equal(bits(device.ps[i]))) << "step " << s << " tensor " << i;
      }
    }
  };
  const auto archive = [](const torchamp::optim::AdamW& opt) {
    std::stringstream bytes;
    torch::save(opt, bytes);
    return bytes.str();
  };
  // What the two archives hold: the rounding count, and each parameter's
  // step count and moments (not the bytes: an archive carries a random id).
  const auto same_archives = [&] {
    int64_t counts[2];
    int k = 0;
    for (const auto* t : {&host, &device}) {
      std::stringstream bytes(archive(t->opt));
      torch::serialize::InputArchive in, rounding;
      in.load_from(bytes);
      ASSERT_TRUE(in.try_read("torchamp_stochastic_rounding", rounding));
      c10::IValue updates;
      ASSERT_TRUE(rounding.try_read("updates", updates));
      counts[k++] = updates.toInt();
    }
    EXPECT_EQ(counts[0], counts[1]);
    for (size_t i = 0; i < host.ps.size(); ++i) {
      const auto state = [i](const auto& t) -> const torch::optim::AdamWParamState& {
        const auto key = torchamp::compat::optim_state_key(t.opt.state(), t.ps[i]);
        return static_cast<const torch::optim::AdamWParamState&>(*t.opt.state().at(key));
      };
      const auto& a = state(host);
      const auto& b = state(device);
      EXPECT_EQ(a.step(), b.step()) << "tensor " << i;
      EXPECT_TRUE(bits(a.exp_avg()).equal(bits(b.exp_avg()))) << "tensor " << i;
      EXPECT_TRUE(bits(a.exp_avg_sq()).equal(bits(b.exp_avg_sq()))) << "tensor " << i;
    }
  };
  run(0, 20);
  const std::string at20 = archive(host.opt);
  std::vector<at::Tensor> params20;
  for (const auto& p : host.ps) {
    params20.push_back(p.detach().clone());
  }
  run(20, 30);
  ASSERT_GT(skipped, 0);
  same_archives();
  // Both back at step 20 (parameters and optimizers; the scalers stay, alike):
  // the device run's count is the archive's again, not the one it held.
  for (auto* t : {&host, &device}) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < t->ps.size(); ++i) {
      t->ps[i].copy_(params20[i]);
    }
    std::stringstream bytes(at20);
    torch::load(t->opt, bytes);
  }
  run(20, 40);
  same_archives();
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
  // Stochastic rounding on this path refuses what it refuses on the CPU's.
  std::vector<at::Tensor> floats = {torch::zeros({4})};
  torchamp_test::expect_throws<c10::ValueError>(
      [&] {
        torchamp::optim::AdamW(floats, torch::optim::AdamWOptions(),
                               FusedOptions().aten_kernels(true).stochastic_rounding(true));
      },
      "stochastic rounding applies to bfloat16 parameters only");
}

}  // namespace
