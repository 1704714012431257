// Stochastic rounding in the fused optimizers (FusedOptions().stochastic_rounding):
// the rounding itself (exactly unbiased, one of the two neighbours), the
// optimizers' use of it (unbiased updates, bfloat16 state, same seed same
// bits on any thread count, exact resume, skipped steps), and the typed
// errors that change nothing.

#include "test_util.h"

#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include "compat/compat.h"    // optim_state_key
#include "kernels/bf16.h"     // float_to_bf16_stochastic
#include "kernels/kernels.h"  // cap_isa, cpu_features

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using torchamp::optim::FusedOptions;
namespace k = torchamp::kernels;

const FusedOptions kStochastic = FusedOptions().stochastic_rounding(true);

// bfloat16 bits of a tensor, as int16 (for bit-for-bit comparisons).
at::Tensor bits16(const at::Tensor& t) {
  return t.contiguous().view(at::kShort);
}

bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!bits16(a[i]).equal(bits16(b[i]))) {
      return false;
    }
  }
  return true;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) {
    out.push_back(p.detach().clone());
  }
  return out;
}

// bfloat16 parameters of several sizes (one longer than a thread's piece).
std::vector<at::Tensor> make_params(int64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> ps;
  for (int64_t n : {1, 33, 1000, 300000}) {
    ps.push_back(torch::randn({n}).to(at::kBFloat16).requires_grad_());
  }
  return ps;
}

// An optimizer's archive, as bytes.
template <class Opt>
std::string saved(const Opt& opt) {
  std::stringstream bytes;
  torch::serialize::OutputArchive out;
  opt.save(out);
  out.save_to(bytes);
  return bytes.str();
}

template <class Opt>
void load_bytes(Opt& opt, const std::string& bytes) {
  std::stringstream in_bytes(bytes);
  torch::serialize::InputArchive in;
  in.load_from(in_bytes);
  opt.load(in);
}

// Step `step`'s gradients: a function of the step and the parameter alone.
void set_grads(const std::vector<at::Tensor>& ps, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    torch::manual_seed(1000 * step + static_cast<int64_t>(i));
    ps[i].mutable_grad() = (torch::randn(ps[i].sizes()) * 1e-2).to(at::kBFloat16);
  }
}

template <class Opt>
void train(Opt& opt, const std::vector<at::Tensor>& ps, int from, int to) {
  for (int step = from; step < to; ++step) {
    set_grads(ps, step);
    opt.step();
  }
}

torch::optim::AdamWOptions adamw() {
  return torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
}

}  // namespace

TEST(StochasticRounding, RoundingIsExactlyUnbiasedAndGivesANeighbour) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {
      1.0f,           1.0f + 0x1p-10f, 1.0f + 0x1p-8f, 1.0f + 0x1p-7f - 0x1p-23f,
      -3.14159f,      1e-3f,           -7.5e-7f,       0x1p-130f /* float32 subnormal */,
      -0x1.234p-140f, 6.0e37f,         123456.789f,    0.0f,
      -0.0f,
  };
  for (const float v : values) {
    SCOPED_TRACE(v);
    const uint32_t b = k::bits_of(v);
    const float toward_zero = k::bf16_to_float(static_cast<uint16_t>(b >> 16));
    const float away = k::bf16_to_float(static_cast<uint16_t>((b >> 16) + 1));
    double sum = 0;
    int ups = 0;
    for (uint32_t noise = 0; noise < 65536; ++noise) {
      const float r = k::bf16_to_float(k::float_to_bf16_stochastic(v, noise));
      ASSERT_TRUE(r == toward_zero || r == away) << "noise " << noise << " gave " << r;
      ups += r == away && away != toward_zero ? 1 : 0;
      sum += static_cast<double>(r);
    }
    // Over every noise value the mean is the value itself, exactly.
    EXPECT_EQ(sum / 65536.0, static_cast<double>(v));
    EXPECT_EQ(ups, static_cast<int>(b & 0xffffu));
  }
  EXPECT_EQ(k::float_to_bf16_stochastic(inf, 0xffff), 0x7f80);
  EXPECT_EQ(k::float_to_bf16_stochastic(-inf, 0xffff), 0xff80);
  EXPECT_EQ(k::float_to_bf16_stochastic(std::nanf(""), 0x1234), 0x7fc0);
  // Above bfloat16's largest finite value, infinity is the neighbour above.
  EXPECT_EQ(k::float_to_bf16_stochastic(std::numeric_limits<float>::max(), 0xffff), 0x7f80);
}

// An update far below half a bfloat16 step: round to nearest loses it every
// time, stochastic rounding keeps it on average, over elements and steps.
TEST(StochasticRounding, SmallUpdatesAreKeptOnAverage) {
  const int64_t n = 1 << 18;
  const int steps = 64;
  const double delta = std::ldexp(1.0, -12);  // 1/32 of the bfloat16 step at 1
  for (const bool stochastic : {false, true}) {
    SCOPED_TRACE(stochastic);
    at::Tensor p = torch::ones({n}, at::kBFloat16).requires_grad_();
    torchamp::optim::SGD opt({p}, torch::optim::SGDOptions(1.0),
                             FusedOptions().stochastic_rounding(stochastic));
    for (int s = 0; s < steps; ++s) {
      p.mutable_grad() = torch::full({n}, -delta, at::kBFloat16);
      opt.step();
    }
    const double mean = p.to(at::kDouble).mean().item<double>();
    if (!stochastic) {
      EXPECT_EQ(mean, 1.0);  // every update lost
      continue;
    }
    // Each element's value is a sum of independent roundings, each of
    // variance at most step^2 / 4: the mean's standard deviation is below
    // step * sqrt(steps / 4 / n).
    const double sigma = std::ldexp(1.0, -7) * std::sqrt(steps / 4.0 / static_cast<double>(n));
    EXPECT_NEAR(mean, 1.0 + steps * delta, 6 * sigma);
    // Each element took its own draws, step after step: its count of steps
    // up is binomial (64 draws at 1/32: standard deviation 1.4 steps), not
    // all or nothing as with noise repeated across steps (32 steps).
    const double spread = p.to(at::kDouble).std().item<double>() / std::ldexp(1.0, -7);
    EXPECT_GT(spread, 1.0);
    EXPECT_LT(spread, 2.0);
  }
}

TEST(StochasticRounding, StateIsBfloat16AndSameSeedGivesSameBitsOnAnyThreadCount) {
  std::vector<std::vector<at::Tensor>> runs;
  for (const int t : {1, 2, 1}) {
    const torchamp_test::ScopedThreads threads(t);
    auto ps = make_params(3);
    torchamp::optim::AdamW opt(ps, adamw(), kStochastic);
    train(opt, ps, 0, 10);
    for (const auto& p : ps) {
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(
          *opt.state().at(torchamp::compat::optim_state_key(opt.state(), p)));
      EXPECT_EQ(st.exp_avg().scalar_type(), at::kBFloat16);
      EXPECT_EQ(st.exp_avg_sq().scalar_type(), at::kBFloat16);
    }
    runs.push_back(clones(ps));
  }
  EXPECT_TRUE(same_bits(runs[0], runs[1]));
  EXPECT_TRUE(same_bits(runs[0], runs[2]));

  // Another seed rounds otherwise; so does round to nearest.
  auto other = make_params(3);
  torchamp::optim::AdamW seeded(other, adamw(), FusedOptions().stochastic_rounding(true).seed(7));
  train(seeded, other, 0, 10);
  EXPECT_FALSE(same_bits(runs[0], clones(other)));
  auto nearest = make_params(3);
  torchamp::optim::AdamW plain(nearest, adamw());
  train(plain, nearest, 0, 10);
  EXPECT_FALSE(same_bits(runs[0], clones(nearest)));
  EXPECT_EQ(seeded.fused_options().seed(), 7u);
  EXPECT_TRUE(seeded.fused_options().stochastic_rounding());
}

// save, then load into a new optimizer (constructed with another seed: the
// archive's generator wins) and continue: the same bits as never stopping.
TEST(StochasticRounding, SaveAndLoadResumeBitForBit) {
  for (const bool sgd : {false, true}) {
    SCOPED_TRACE(sgd ? "SGD" : "Adam");
    const auto run = [&](auto& opt, std::vector<at::Tensor>& ps) {
      train(opt, ps, 0, 6);
      const std::string archive = saved(opt);
      const auto at_save = clones(ps);
      train(opt, ps, 6, 12);
      const auto straight = clones(ps);

      auto resumed = clones(at_save);
      for (auto& p : resumed) {
        p.requires_grad_();
      }
      auto fresh = [&] {
        if constexpr (std::is_same_v<std::decay_t<decltype(opt)>, torchamp::optim::SGD>) {
          return torchamp::optim::SGD(resumed, torch::optim::SGDOptions(0.1).momentum(0.9),
                                      FusedOptions().stochastic_rounding(true).seed(99));
        } else {
          return torchamp::optim::Adam(resumed, torch::optim::AdamOptions(1e-3),
                                       FusedOptions().stochastic_rounding(true).seed(99));
        }
      };
      auto again = fresh();
      load_bytes(again, archive);
      EXPECT_EQ(again.fused_options().seed(), 0u);
      train(again, resumed, 6, 12);
      EXPECT_TRUE(same_bits(straight, clones(resumed)));
    };
    auto ps = make_params(5);
    if (sgd) {
      torchamp::optim::SGD opt(ps, torch::optim::SGDOptions(0.1).momentum(0.9), kStochastic);
      run(opt, ps);
    } else {
      torchamp::optim::Adam opt(ps, torch::optim::AdamOptions(1e-3), kStochastic);
      run(opt, ps);
    }
  }
}

// A step the scaler skips changes nothing, the generator included: the run
// with a skipped step in the middle ends as the run without it.
TEST(StochasticRounding, ASkippedStepChangesNothingTheGeneratorIncluded) {
  auto ps = make_params(6);
  torchamp::optim::AdamW opt(ps, adamw(), kStochastic);
  train(opt, ps, 0, 3);
  set_grads(ps, 99);
  const auto before = clones(ps);
  ASSERT_TRUE(opt.supports_amp_scaling());
  torchamp::AmpStepArgs skipped;
  skipped.found_inf = true;
  opt.amp_step(skipped);
  EXPECT_TRUE(same_bits(before, clones(ps)));
  train(opt, ps, 3, 8);

  auto qs = make_params(6);
  torchamp::optim::AdamW straight(qs, adamw(), kStochastic);
  train(straight, qs, 0, 8);
  EXPECT_TRUE(same_bits(clones(qs), clones(ps)));

  // Through the GradScaler: an inf gradient skips the step.
  torchamp::GradScaler scaler;
  (void)scaler.scale(torch::ones({1}));
  set_grads(ps, 100);
  ps[2].mutable_grad()[5] = std::numeric_limits<float>::infinity();
  const auto held = clones(ps);
  scaler.step(opt);
  scaler.update();
  EXPECT_TRUE(same_bits(held, clones(ps)));
}

TEST(StochasticRounding, BadOptionsAreTypedErrorsThatChangeNothing) {
  using torchamp_test::expect_throws;
  auto ps = make_params(8);
  expect_throws<c10::ValueError>(
      [&] {
        torchamp::optim::AdamW opt(ps, adamw(),
                                   FusedOptions().stochastic_rounding(true).master_weights(true));
      },
      "stochastic_rounding(true) together with master_weights(true)");
  std::vector<at::Tensor> mixed = {ps[0], torch::zeros({3}, torch::requires_grad())};
  expect_throws<c10::ValueError>(
      [&] { torchamp::optim::SGD opt(mixed, torch::optim::SGDOptions(0.1), kStochastic); },
      "param_groups[0].params[1] is Float; stochastic rounding applies to bfloat16 parameters "
      "only");

  // A parameter cast after the optimizer was made: refused at the step,
  // before anything is written.
  torchamp::optim::Adam opt(ps, torch::optim::AdamOptions(1e-3), kStochastic);
  train(opt, ps, 0, 2);
  {
    torch::NoGradGuard no_grad;
    ps[3].set_data(ps[3].to(at::kHalf));
  }
  set_grads(ps, 2);
  ps[3].mutable_grad() = ps[3].grad().to(at::kHalf);
  const auto before = clones(ps);
  const std::string state_before = saved(opt);
  expect_throws<c10::ValueError>([&] { opt.step(); }, "params[3] is Half");
  for (size_t i = 0; i < ps.size(); ++i) {
    EXPECT_TRUE(ps[i].detach().view(at::kShort).equal(before[i].view(at::kShort)));
  }
  EXPECT_EQ(state_before, saved(opt));

  // Archives: a generator into a round-to-nearest optimizer, and none into a
  // stochastic one, are refused, loading nothing.
  auto qs = make_params(8);
  torchamp::optim::Adam nearest(qs, torch::optim::AdamOptions(1e-3));
  train(nearest, qs, 0, 2);
  const std::string plain = saved(nearest);
  auto rs = make_params(9);
  torchamp::optim::Adam stochastic(rs, torch::optim::AdamOptions(1e-3), kStochastic);
  train(stochastic, rs, 0, 3);
  const std::string stochastic_before = saved(stochastic);
  expect_throws<c10::ValueError>([&] { load_bytes(stochastic, plain); },
                                 "rounds stochastically (FusedOptions().stochastic_rounding(true)) "
                                 "but the archive has no generator");
  EXPECT_EQ(saved(stochastic), stochastic_before);
  expect_throws<c10::ValueError>([&] { load_bytes(nearest, state_before); },
                                 "holds a stochastic rounding generator");
  EXPECT_EQ(saved(nearest), plain);
}

// FusedOptions().state_dtype(kFloat): the moments are float32 and stored as
// computed (the first step's exp_avg is exactly LibTorch's float32 AdamW's;
// the parameter one of the two bfloat16 neighbours of that AdamW's float32
// update); 12 bytes a parameter; same bits on any thread count; exact resume;
// fused_options() says it; a bfloat16 archive's state is refused at the step
// and a bad state_dtype at construction, each changing nothing.
TEST(StochasticRounding, Float32StateIsKeptExactly) {
  const FusedOptions wide = FusedOptions(kStochastic).state_dtype(at::kFloat);
  auto ps = make_params(12);
  std::vector<at::Tensor> f32;
  for (const auto& p : ps) {
    f32.push_back(p.detach().to(at::kFloat).requires_grad_());
  }
  torchamp::optim::AdamW opt(ps, adamw(), wide);
  torch::optim::AdamW reference(f32, adamw());
  set_grads(ps, 0);
  for (size_t i = 0; i < ps.size(); ++i) {
    f32[i].mutable_grad() = ps[i].grad().to(at::kFloat);
  }
  opt.step();
  reference.step();
  for (size_t i = 0; i < ps.size(); ++i) {
    const auto& a = static_cast<const torch::optim::AdamWParamState&>(
        *opt.state().at(torchamp::compat::optim_state_key(opt.state(), ps[i])));
    const auto& r = static_cast<const torch::optim::AdamWParamState&>(
        *reference.state().at(torchamp::compat::optim_state_key(reference.state(), f32[i])));
    ASSERT_EQ(a.exp_avg().scalar_type(), at::kFloat);
    ASSERT_EQ(a.exp_avg_sq().scalar_type(), at::kFloat);
    EXPECT_TRUE(a.exp_avg().equal(r.exp_avg())) << "tensor " << i;
    EXPECT_TRUE(torch::allclose(a.exp_avg_sq(), r.exp_avg_sq(), 1e-6, 0)) << "tensor " << i;
    // The parameter: the float32 update rounded down or up to bfloat16.
    const at::Tensor x = f32[i].detach();
    const at::Tensor down = x.view(at::kInt).bitwise_and(~0xffff).view(at::kFloat);
    const at::Tensor up = (x.view(at::kInt).bitwise_and(~0xffff) + 0x10000).view(at::kFloat);
    const at::Tensor got = ps[i].detach().to(at::kFloat);
    EXPECT_TRUE(((got == down) | (got == up) | (got == x)).all().item<bool>()) << "tensor " << i;
  }
  EXPECT_EQ(opt.fused_options().state_dtype(), c10::optional<at::ScalarType>(at::kFloat));

  // Same bits on 1 and 2 threads, and resumed from an archive.
  std::vector<std::vector<at::Tensor>> runs;
  for (const int t : {1, 2}) {
    const torchamp_test::ScopedThreads threads(t);
    auto qs = make_params(13);
    torchamp::optim::Adam a(qs, torch::optim::AdamOptions(1e-3), wide);
    train(a, qs, 0, 4);
    const std::string archive = saved(a);
    const auto at_save = clones(qs);
    train(a, qs, 4, 8);
    runs.push_back(clones(qs));
    auto resumed = clones(at_save);
    for (auto& r : resumed) {
      r.requires_grad_();
    }
    torchamp::optim::Adam again(resumed, torch::optim::AdamOptions(1e-3), wide);
    load_bytes(again, archive);
    train(again, resumed, 4, 8);
    EXPECT_TRUE(same_bits(runs.back(), clones(resumed)));
  }
  EXPECT_TRUE(same_bits(runs[0], runs[1]));

  using torchamp_test::expect_throws;
  expect_throws<c10::ValueError>(
      [&] {
        torchamp::optim::AdamW bad(ps, adamw(), FusedOptions(kStochastic).state_dtype(at::kHalf));
      },
      "state_dtype(Half): the state of a stochastically rounded parameter is BFloat16 or Float");
  expect_throws<c10::ValueError>(
      [&] { torchamp::optim::AdamW bad(ps, adamw(), FusedOptions().state_dtype(at::kFloat)); },
      "state_dtype(Float) without stochastic_rounding(true)");
  // An archive of bfloat16 moments into a float32-state optimizer: its step
  // is refused, before anything is written.
  auto rs = make_params(14);
  torchamp::optim::AdamW narrow(rs, adamw(), kStochastic);
  train(narrow, rs, 0, 2);
  torchamp::optim::AdamW widened(rs, adamw(), wide);
  load_bytes(widened, saved(narrow));
  set_grads(rs, 2);
  const auto before = clones(rs);
  const std::string state_before = saved(widened);
  expect_throws<c10::NotImplementedError>([&] { widened.step(); }, "param_groups[0].params[0]");
  EXPECT_TRUE(same_bits(before, clones(rs)));
  EXPECT_EQ(state_before, saved(widened));
}

// The vector loops (AVX2, AVX-512) give the one-pass loop's bits: every
// bfloat16 pattern as gradient, tails of every length, each optimizer, with
// and without the unscale, bfloat16 and float32 state, on 1 and 2 threads.
TEST(StochasticRounding, VectorPathEqualsTheOnePassLoop) {
  using torchamp::kernels::Isa;
  const auto& cpu = torchamp::kernels::cpu_features();
  std::vector<Isa> isas;
  if (cpu.avx2_f16c) {
    isas.push_back(Isa::avx2);
  }
  if (cpu.avx512) {
    isas.push_back(Isa::avx512);
  }
  if (isas.empty()) {
    GTEST_SKIP() << "this CPU has no vector path (AVX2 + F16C, AVX-512)";
  }
  const Isa cap_was = torchamp::kernels::isa_cap();
  const int threads_was = at::get_num_threads();
  // The parameters', gradients' and state's 16 bits after three steps.
  const auto run = [](Isa isa, int threads, int which, std::optional<float> scale,
                      bool float_state) {
    const FusedOptions sr =
        float_state ? FusedOptions(kStochastic).state_dtype(at::kFloat) : kStochastic;
    std::vector<at::Tensor> ps;
    int64_t k = 0;
    for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 2047, 2048, 65536 + 3}) {
      at::Tensor p = torch::empty({n}, at::kBFloat16), g = torch::empty({n}, at::kBFloat16);
      auto* pb = static_cast<uint16_t*>(p.data_ptr());
      auto* gb = static_cast<uint16_t*>(g.data_ptr());
      for (int64_t i = 0; i < n; ++i, ++k) {
        gb[i] = static_cast<uint16_t>(k * 40503u);             // every pattern, scrambled
        pb[i] = static_cast<uint16_t>((k * 7919u) & 0x7f7fu);  // finite
      }
      p.mutable_grad() = g;
      ps.push_back(p);
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (which == 0) {
      opt = std::make_unique<torchamp::optim::AdamW>(
          ps, torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true), sr);
    } else if (which == 1) {
      opt = std::make_unique<torchamp::optim::Adam>(
          ps, torch::optim::AdamOptions(1e-2).weight_decay(0.1), sr);
    } else {
      opt = std::make_unique<torchamp::optim::SGD>(
          ps, torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true).weight_decay(0.1), sr);
    }
    torchamp::kernels::cap_isa(isa);
    at::set_num_threads(threads);
    for (int step = 0; step < 3; ++step) {
      torchamp::AmpStepArgs args;
      args.grad_scale = scale;
      dynamic_cast<torchamp::StepSupportsAmpScaling&>(*opt).amp_step(args);
    }
    // State bits; a float32 NaN's payload aside (the compiler may swap the
    // operands of a + b in the one-pass loop, and x86 keeps the first NaN's;
    // bfloat16 stores make every NaN 0x7FC0).
    const auto state_bits = [](const at::Tensor& t) {
      return bits16(t.scalar_type() == at::kFloat
                        ? t.masked_fill(t.isnan(), std::numeric_limits<float>::quiet_NaN())
                        : t);
    };
    std::vector<at::Tensor> out;
    for (const auto& p : ps) {
      out.push_back(bits16(p.detach()));
      out.push_back(bits16(p.grad()));
      const auto& st = *opt->state().at(torchamp::compat::optim_state_key(opt->state(), p));
      if (which == 2) {
        out.push_back(
            state_bits(static_cast<const torch::optim::SGDParamState&>(st).momentum_buffer()));
      } else {
        const auto& a = static_cast<const torch::optim::AdamParamState&>(st);
        out.push_back(state_bits(a.exp_avg()));
        out.push_back(state_bits(a.exp_avg_sq()));
        if (a.max_exp_avg_sq().defined()) {
          out.push_back(state_bits(a.max_exp_avg_sq()));
          // AMSGrad's max rounds with its value's noise: never below it.
          const at::Tensor below =
              a.max_exp_avg_sq().to(at::kFloat) < a.exp_avg_sq().to(at::kFloat);
          EXPECT_EQ(below.sum().item<int64_t>(), 0);
        }
      }
    }
    return out;
  };
  for (const int threads : {1, 2}) {
    for (int which = 0; which < 3; ++which) {
      for (const auto scale : {std::optional<float>(), std::optional<float>(1024.0f)}) {
        for (const bool float_state : {false, true}) {
          const auto portable = run(Isa::portable, threads, which, scale, float_state);
          for (const Isa isa : isas) {
            SCOPED_TRACE(std::string(torchamp::kernels::isa_name(isa)) + " threads " +
                         std::to_string(threads) + " optimizer " + std::to_string(which) +
                         (scale ? " unscaling" : "") + (float_state ? " float32 state" : ""));
            const auto vec = run(isa, threads, which, scale, float_state);
            ASSERT_EQ(vec.size(), portable.size());
            for (size_t t = 0; t < vec.size(); ++t) {
              EXPECT_TRUE(vec[t].equal(portable[t])) << "tensor " << t;
            }
          }
        }
      }
    }
  }
  torchamp::kernels::cap_isa(cap_was);
  at::set_num_threads(threads_was);
}
