// Master weights in torchamp::optim (float16/bfloat16 parameters with
// float32 masters and state), the GradScaler taking their float16 gradients,
// clipping folded into the scale, and the Paddle facade's float16 unscale.
#include "test_util.h"

#include <torchamp/optim.h>
#include <torchamp/paddle.h>

#include "compat/compat.h"    // optim_state_key
#include "kernels/kernels.h"  // cap_isa, cpu_features

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;
using torchamp::optim::FusedOptions;

const FusedOptions kMasters = FusedOptions().master_weights(true);

std::vector<at::Tensor> make_params(at::ScalarType dtype, int64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> ps;
  for (int64_t n : {1, 33, 1000, 40000}) {
    ps.push_back(torch::randn({n}).to(dtype));
  }
  ps.push_back(torch::randn({20, 30}).to(dtype));
  return ps;
}

// Float32 bits of a tensor, as int32 (for bit-for-bit comparisons).
at::Tensor bits(const at::Tensor& t) {
  return t.to(at::kFloat).contiguous().view(at::kInt);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && bits(a).equal(bits(b));
}

template <class Opt, class Options>
std::unique_ptr<torch::optim::Optimizer> make(std::vector<at::Tensor> ps, const Options& options,
                                              FusedOptions fused = FusedOptions()) {
  return std::make_unique<Opt>(std::move(ps), options, fused);
}

// A low-precision model with master weights against a float32 model with
// the same optimizer, both through a GradScaler, on the same gradients (the
// float32 model's are the low-precision ones upcast), with overflows among
// the steps. The masters must equal the float32 parameters bit for bit.
// `path`: both optimizers' other options (ATen's path: aten_kernels).
template <class Opt, class Options>
void masters_track_float32(at::ScalarType dtype, const Options& options, const char* what,
                           FusedOptions path, int steps) {
  SCOPED_TRACE(std::string(what) + " " + c10::toString(dtype) +
               (path.aten_kernels() ? " on ATen's path" : ""));
  auto low = make_params(dtype, 1);
  std::vector<at::Tensor> ref;
  for (const auto& p : low) {
    ref.push_back(p.to(at::kFloat));
  }
  Opt low_opt(low, options, FusedOptions(path).master_weights(true));
  Opt ref_opt(ref, options, path);
  const auto opts = GradScalerOptions().init_scale(1024).growth_interval(50);
  GradScaler low_scaler(opts), ref_scaler(opts);
  int skipped = 0;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(1000 + s);
    const bool overflow = s % 97 == 13;
    for (size_t i = 0; i < low.size(); ++i) {
      at::Tensor g = (torch::randn(low[i].sizes()) * low_scaler.get_scale() * 1e-3).to(dtype);
      if (overflow && i == 2) {
        g[5] = std::numeric_limits<float>::infinity();
      }
      low[i].mutable_grad() = g;
      ref[i].mutable_grad() = g.to(at::kFloat);
    }
    std::vector<at::Tensor> before;
    if (overflow) {
      for (const auto& p : low) {
        before.push_back(p.clone());
      }
    }
    const bool stepped = low_scaler.step(low_opt).has_value();
    EXPECT_EQ(stepped, ref_scaler.step(ref_opt).has_value()) << "step " << s;
    EXPECT_EQ(stepped, !overflow) << "step " << s;
    low_scaler.update();
    ref_scaler.update();
    ASSERT_EQ(low_scaler.get_scale(), ref_scaler.get_scale());
    if (!stepped) {
      ++skipped;
      for (size_t i = 0; i < low.size(); ++i) {
        EXPECT_TRUE(low[i].equal(before[i])) << "a skipped step changed parameter " << i;
      }
    }
    if (s % 100 == 99 || s == steps - 1 || path.aten_kernels()) {
      for (size_t i = 0; i < low.size(); ++i) {
        const at::Tensor master = low_opt.master_weight(low[i]);
        ASSERT_TRUE(master.defined());
        ASSERT_EQ(master.scalar_type(), at::kFloat);
        ASSERT_TRUE(same_bits(master, ref[i]))
            << "step " << s << " tensor " << i << ": master differs from the float32 model by "
            << (master - ref[i]).abs().max().item<double>();
        ASSERT_TRUE(low[i].equal(torchamp_test::master_rounded(ref[i], dtype)))
            << "step " << s << " tensor " << i << ": the parameter is not its master rounded";
      }
    }
  }
  EXPECT_GE(skipped, steps / 97);  // an overflow every 97 steps
  // float32 state, as the float32 model's.
  for (const auto& t : low_opt.state()) {
    const auto* adam = dynamic_cast<const torch::optim::AdamWParamState*>(t.second.get());
    if (adam != nullptr) {
      EXPECT_EQ(adam->exp_avg().scalar_type(), at::kFloat);
    }
  }
}

// Each optimizer on float16 and bfloat16 parameters.
void every_optimizer_tracks_float32(FusedOptions path, int steps) {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    masters_track_float32<torchamp::optim::AdamW>(
        dtype, torch::optim::AdamWOptions(1e-3).weight_decay(0.1), "AdamW", path, steps);
    masters_track_float32<torchamp::optim::Adam>(
        dtype, torch::optim::AdamOptions(1e-3).weight_decay(0.01).amsgrad(true), "Adam amsgrad",
        path, steps);
    masters_track_float32<torchamp::optim::SGD>(
        dtype, torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true).weight_decay(1e-4),
        "SGD nesterov", path, steps);
  }
}

TEST(MasterWeights, ThousandStepsWithSkipsEqualAFloat32ModelBitForBit) {
  every_optimizer_tracks_float32(FusedOptions(), 1000);
}

// The same on ATen's path (CUDA's, here on the CPU with aten_kernels): the
// masters joined, updated by ATen's fused op and split back (src/optim/
// aten_masters.cpp) equal a float32 model on that path at every step.
TEST(MasterWeights, OnAtensPathEqualAFloat32ModelBitForBitEveryStep) {
  if (!torchamp::compat::kAtenFusedOptimizers) {
    GTEST_SKIP() << "ATen's fused optimizer ops need LibTorch 2.4 or later";
  }
  every_optimizer_tracks_float32(FusedOptions().aten_kernels(true), 200);
}

// Master weights run a vector at a time where the CPU has AVX2 + F16C (8
// lanes) or AVX-512 (16 lanes, the tail masked); TORCHAMP_PORTABLE_KERNELS
// keeps the one-pass loop. Each vector path this CPU has gives the one-pass
// loop's bits: parameters, gradients, masters and optimizer state, for
// float16 and bfloat16 parameters, every 16-bit gradient pattern (NaNs with
// every payload, infinities, subnormals) and many parameter patterns, on
// lengths around both vector widths, for Adam, AdamW (with amsgrad), SGD
// (momentum, nesterov), with and without a grad_scale (the gradients written
// back). On one thread (each job one piece from its start; the 65539-element
// one takes the stream prefetch) and on two (pieces that start and end
// inside a job).
TEST(MasterWeights, VectorPathEqualsTheOnePassLoopOnEveryPattern) {
  using torchamp::kernels::Isa;
  // The kernels' cap and ATen's thread count for one run, put back after it.
  struct Setting {
    Isa isa_was = torchamp::kernels::isa_cap();
    torchamp_test::ScopedThreads threads;
    Setting(Isa isa, int n) : threads(n) { torchamp::kernels::cap_isa(isa); }
    ~Setting() { torchamp::kernels::cap_isa(isa_was); }
  };
  // Per parameter: the parameter's and the gradient's 16 bits, then the
  // master's float32 bits (a bfloat16 master's: (parameter << 16) +
  // remainder) and the state's, as int32.
  const auto run = [&](at::ScalarType dtype, Isa isa, int threads, int which,
                       std::optional<float> scale) {
    std::vector<at::Tensor> ps;
    int64_t k = 0;
    // Finite parameters: float16's exponent, or bfloat16's, below all ones.
    const uint32_t finite = dtype == at::kHalf ? 0x7bffu : 0x7f7fu;
    for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 2047, 2048, 65536 + 3}) {
      at::Tensor p = torch::empty({n}, dtype), g = torch::empty({n}, dtype);
      auto* pb = static_cast<uint16_t*>(p.data_ptr());
      auto* gb = static_cast<uint16_t*>(g.data_ptr());
      for (int64_t i = 0; i < n; ++i, ++k) {
        gb[i] = static_cast<uint16_t>(k * 40503u);  // every pattern, scrambled
        pb[i] = static_cast<uint16_t>((k * 7919u) & finite);
      }
      p.mutable_grad() = g;
      ps.push_back(p);
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    std::function<at::Tensor(const at::Tensor&)> master_of;
    std::function<std::vector<at::Tensor>(const at::Tensor&)> state_of;
    const auto state = [](const torch::optim::Optimizer& o, const at::Tensor& p) -> const auto& {
      return *o.state().at(torchamp::compat::optim_state_key(o.state(), p));
    };
    if (which == 0) {
      auto o = std::make_unique<torchamp::optim::AdamW>(
          ps, torch::optim::AdamWOptions(1e-2).weight_decay(0.1).amsgrad(true), kMasters);
      master_of = [o = o.get()](const at::Tensor& p) { return o->master_weight_storage(p); };
      state_of = [o = o.get(), state](const at::Tensor& p) {
        const auto& st = static_cast<const torch::optim::AdamWParamState&>(state(*o, p));
        return std::vector<at::Tensor>{st.exp_avg(), st.exp_avg_sq(), st.max_exp_avg_sq()};
      };
      opt = std::move(o);
    } else if (which == 1) {
      auto o = std::make_unique<torchamp::optim::Adam>(
          ps, torch::optim::AdamOptions(1e-2).weight_decay(0.1), kMasters);
      master_of = [o = o.get()](const at::Tensor& p) { return o->master_weight_storage(p); };
      state_of = [o = o.get(), state](const at::Tensor& p) {
        const auto& st = static_cast<const torch::optim::AdamParamState&>(state(*o, p));
        return std::vector<at::Tensor>{st.exp_avg(), st.exp_avg_sq()};
      };
      opt = std::move(o);
    } else {
      auto o = std::make_unique<torchamp::optim::SGD>(
          ps, torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true).weight_decay(0.1),
          kMasters);
      master_of = [o = o.get()](const at::Tensor& p) { return o->master_weight_storage(p); };
      state_of = [o = o.get(), state](const at::Tensor& p) {
        const auto& st = static_cast<const torch::optim::SGDParamState&>(state(*o, p));
        return std::vector<at::Tensor>{st.momentum_buffer()};
      };
      opt = std::move(o);
    }
    {
      const Setting setting(isa, threads);
      EXPECT_EQ(at::get_num_threads(), threads);
      for (int step = 0; step < 3; ++step) {
        torchamp::AmpStepArgs args;
        args.grad_scale = scale;
        dynamic_cast<torchamp::StepSupportsAmpScaling&>(*opt).amp_step(args);
      }
    }
    std::vector<std::vector<at::Tensor>> out;
    for (const auto& p : ps) {
      std::vector<at::Tensor> bits = {p.detach().view(torch::kShort).clone(),
                                      p.grad().view(torch::kShort).clone()};
      const at::Tensor m = master_of(p);
      if (dtype == at::kHalf) {
        bits.push_back(m.view(torch::kInt).clone());
      } else {  // (parameter << 16) + remainder modulo 2^32, in int64, as int32 bits
        const auto b = torch::remainder(
            p.detach().view(torch::kShort).to(torch::kLong).bitwise_and(0xffff) * 65536 +
                m.to(torch::kLong),
            int64_t{1} << 32);
        bits.push_back(
            torch::where(b >= (int64_t{1} << 31), b - (int64_t{1} << 32), b).to(torch::kInt));
      }
      for (const auto& t : state_of(p)) {
        bits.push_back(t.view(torch::kInt).clone());
      }
      out.push_back(std::move(bits));
    }
    return out;
  };
  const auto& cpu = torchamp::kernels::cpu_features();
  std::vector<Isa> isas;
  if (cpu.avx2_f16c) {
    isas.push_back(Isa::avx2);
  }
  if (cpu.avx512) {
    isas.push_back(Isa::avx512);
  }
  if (isas.empty()) {
    GTEST_SKIP() << "this CPU has no vector path for master weights (AVX2 + F16C, AVX-512)";
  }
  std::string ran;
  for (const Isa isa : isas) {
    ran += std::string(ran.empty() ? "" : " ") + torchamp::kernels::isa_name(isa);
  }
  RecordProperty("master_weight_paths", ran);
  // A float32's NaN: any equals any other (below).
  const auto float_nan = [](const at::Tensor& bits) { return bits.view(torch::kFloat).isnan(); };
  for (const int threads : {1, 2}) {
    for (const auto dtype : {at::kHalf, at::kBFloat16}) {
      for (int which = 0; which < 3; ++which) {
        for (const auto scale : {std::optional<float>(), std::optional<float>(1024.0f)}) {
          const auto a = run(dtype, Isa::portable, threads, which, scale);
          for (const Isa isa : isas) {
            const auto b = run(dtype, isa, threads, which, scale);
            ASSERT_EQ(a.size(), b.size());
            for (size_t i = 0; i < a.size(); ++i) {
              ASSERT_EQ(a[i].size(), b[i].size());
              const std::string what =
                  std::string(torchamp::kernels::isa_name(isa)) + ", " + c10::toString(dtype) +
                  ", optimizer " + std::to_string(which) + (scale ? " unscaling" : "") + ", " +
                  std::to_string(threads) + " thread(s), parameter " + std::to_string(i);
              // Gradients bit for bit (every NaN stored in 16 bits is
              // c10's), float16 parameters too (sign | 0x7E00). A float32's
              // NaN (the master's, the state's) keeps whichever operand's
              // payload the hardware picked, which IEEE leaves open and
              // compilers reorder (a + b for b + a): any NaN there equals
              // any other, and so does the bfloat16 parameter that is the
              // NaN master's high half.
              const auto master_nan = float_nan(a[i][2]).logical_and(float_nan(b[i][2]));
              const auto param_nan =
                  dtype == at::kHalf ? torch::zeros(master_nan.sizes(), torch::kBool) : master_nan;
              EXPECT_TRUE(torch::equal(a[i][0].masked_fill(param_nan, 0),
                                       b[i][0].masked_fill(param_nan, 0)))
                  << what << ": the parameter";
              EXPECT_TRUE(torch::equal(a[i][1], b[i][1])) << what << ": the gradient";
              for (size_t t = 2; t < a[i].size(); ++t) {
                const auto nan = float_nan(a[i][t]).logical_and(float_nan(b[i][t]));
                EXPECT_TRUE(torch::equal(a[i][t].masked_fill(nan, 0), b[i][t].masked_fill(nan, 0)))
                    << what
                    << (t == 2 ? ": the master" : ": state tensor " + std::to_string(t - 3));
              }
            }
          }
        }
      }
    }
  }
}

// A float16 gradient that is a signalling NaN becomes an SGD momentum
// buffer's first value with no arithmetic on it: every path stores it as
// c10::Half converts it, payload kept and quiet (0x7C01 -> 0x7FC02000), as
// F16C's VCVTPH2PS does. (The test above equates any two float32 NaNs.)
TEST(MasterWeights, SignallingNanGradientIsQuietOnEveryPath) {
  using torchamp::kernels::Isa;
  const Isa was = torchamp::kernels::isa_cap();
  for (const Isa isa : {Isa::portable, Isa::avx2, Isa::avx512}) {
    at::Tensor p = torch::zeros({19}, at::kHalf);  // a full vector of each width and a tail
    p.mutable_grad() = torch::full({19}, 0, at::kHalf);
    p.grad().view(torch::kShort).fill_(0x7c01);
    torchamp::optim::SGD opt({p}, torch::optim::SGDOptions(1e-2).momentum(0.9), kMasters);
    torchamp::kernels::cap_isa(isa);
    dynamic_cast<torchamp::StepSupportsAmpScaling&>(opt).amp_step(torchamp::AmpStepArgs{});
    torchamp::kernels::cap_isa(was);
    const auto& st = static_cast<const torch::optim::SGDParamState&>(
        *opt.state().at(torchamp::compat::optim_state_key(opt.state(), p)));
    EXPECT_TRUE(torch::equal(st.momentum_buffer().view(torch::kInt),
                             torch::full({19}, 0x7fc02000, torch::kInt)))
        << torchamp::kernels::isa_name(isa) << " (capped; the CPU's best: "
        << torchamp::kernels::isa_name(torchamp::kernels::vector_isa()) << ")";
  }
}

TEST(MasterWeights, Bfloat16RemainderIsExactForEveryLowHalf) {
  // Masters at every float32 bit pattern (high half) << 16 | k, k = 0..65535,
  // for even and odd high halves of both signs: two SGD steps (lr 1) from
  // the bfloat16 start s move the master by (k >> 8) * 2^-15 and then
  // (k & 0xff) * 2^-23 (each exact in bfloat16, each sum exact in float32),
  // so the master's bits are exactly s's + k. The pair (parameter,
  // remainder) must give them back, and the parameter must be the high half
  // plus one from k = 0x8000 on (ties away from zero; 0x8000 on an even high
  // half is where round to nearest even would differ).
  const std::vector<uint32_t> highs = {0x3f80u, 0x3f81u, 0xbf80u, 0xbf81u};
  constexpr int64_t kLow = 65536;
  const auto n = static_cast<int64_t>(highs.size()) * kLow;
  at::Tensor p = torch::empty({n}, at::kBFloat16);
  at::Tensor g1 = torch::empty({n}, at::kFloat), g2 = torch::empty({n}, at::kFloat);
  for (size_t h = 0; h < highs.size(); ++h) {
    const float sign = (highs[h] & 0x8000u) != 0 ? -1.0f : 1.0f;
    for (int64_t k = 0; k < kLow; ++k) {
      const int64_t i = static_cast<int64_t>(h) * kLow + k;
      static_cast<uint16_t*>(p.data_ptr())[i] = static_cast<uint16_t>(highs[h]);
      // The gradient moves the magnitude up: p - g.
      g1.data_ptr<float>()[i] = -sign * std::ldexp(static_cast<float>(k >> 8), -15);
      g2.data_ptr<float>()[i] = -sign * std::ldexp(static_cast<float>(k & 0xff), -23);
    }
  }
  ASSERT_TRUE(g1.to(at::kBFloat16).to(at::kFloat).equal(g1));
  ASSERT_TRUE(g2.to(at::kBFloat16).to(at::kFloat).equal(g2));
  torchamp::optim::SGD opt({p}, torch::optim::SGDOptions(1.0), kMasters);
  p.mutable_grad() = g1.to(at::kBFloat16);
  opt.step();
  p.mutable_grad() = g2.to(at::kBFloat16);
  opt.step();
  const at::Tensor master = opt.master_weight(p).contiguous();
  const auto* mb = static_cast<const uint32_t*>(master.data_ptr());
  const auto* pb = static_cast<const uint16_t*>(p.data_ptr());
  int64_t wrong_master = 0, wrong_param = 0;
  for (size_t h = 0; h < highs.size(); ++h) {
    for (int64_t k = 0; k < kLow; ++k) {
      const int64_t i = static_cast<int64_t>(h) * kLow + k;
      wrong_master += mb[i] != ((highs[h] << 16) + static_cast<uint32_t>(k));
      wrong_param += pb[i] != highs[h] + (k >= 0x8000 ? 1u : 0u);
    }
  }
  EXPECT_EQ(wrong_master, 0);
  EXPECT_EQ(wrong_param, 0);
  // And the tie on an even high half: 1 + 2^-8 is stored as 1.0078125.
  EXPECT_EQ(p[0x8000].item<float>(), 1.0078125f);
}

TEST(MasterWeights, UpdatesBelowHalfAnUlpAccumulateOnlyWithMasters) {
  // float16 at 1.0 has an ulp of 2^-10; steps of 1e-4 are below half of it.
  for (bool masters : {false, true}) {
    at::Tensor p = torch::ones({4}, at::kHalf);
    torchamp::optim::SGD opt({p}, torch::optim::SGDOptions(1e-4),
                             FusedOptions().master_weights(masters));
    for (int s = 0; s < 100; ++s) {
      p.mutable_grad() = torch::ones({4}, at::kHalf);
      opt.step();
    }
    const double v = p[0].item<double>();
    if (masters) {
      EXPECT_NEAR(v, 0.99, 1e-3);
      EXPECT_NEAR(opt.master_weight(p)[0].item<double>(), 0.99, 1e-5);
    } else {
      EXPECT_EQ(v, 1.0) << "without masters the updates vanish";
      EXPECT_FALSE(opt.master_weight(p).defined());
    }
  }
}

// Save after some steps, load into a fresh optimizer over copies of the
// parameters, continue both: identical bits, masters included.
template <class Opt, class Options>
void checkpoint_round_trip(at::ScalarType dtype, const Options& options, const char* what) {
  SCOPED_TRACE(std::string(what) + " " + c10::toString(dtype));
  const std::string path = ::testing::TempDir() + "torchamp_masters_" + what + ".pt";
  auto p1 = make_params(dtype, 2);
  Opt first(p1, options, kMasters);
  for (int s = 0; s < 4; ++s) {
    torch::manual_seed(50 + s);
    for (auto& p : p1) {
      p.mutable_grad() = (torch::randn(p.sizes()) * 0.3).to(dtype);
    }
    first.step();
  }
  torch::save(first, path);
  std::vector<at::Tensor> p2;
  for (const auto& p : p1) {
    p2.push_back(p.clone());
  }
  Opt second(p2, options, kMasters);
  torch::load(second, path);
  for (size_t i = 0; i < p1.size(); ++i) {
    ASSERT_TRUE(same_bits(second.master_weight(p2[i]), first.master_weight(p1[i]))) << i;
  }
  for (int s = 0; s < 3; ++s) {
    torch::manual_seed(80 + s);
    for (size_t i = 0; i < p1.size(); ++i) {
      p1[i].mutable_grad() = (torch::randn(p1[i].sizes()) * 0.3).to(dtype);
      p2[i].mutable_grad() = p1[i].grad().clone();
    }
    first.step();
    second.step();
  }
  for (size_t i = 0; i < p1.size(); ++i) {
    EXPECT_TRUE(p1[i].equal(p2[i])) << "parameter " << i;
    EXPECT_TRUE(same_bits(second.master_weight(p2[i]), first.master_weight(p1[i]))) << i;
  }
  std::remove(path.c_str());
}

TEST(MasterWeights, CheckpointsCarryMastersAndRemaindersExactly) {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    checkpoint_round_trip<torchamp::optim::AdamW>(dtype, torch::optim::AdamWOptions(1e-2), "adamw");
    checkpoint_round_trip<torchamp::optim::SGD>(dtype, torch::optim::SGDOptions(0.1).momentum(0.9),
                                                "sgd");
  }
}

// Every tensor of the optimizer's state, cloned, in param order.
std::vector<at::Tensor> snapshot(const torchamp::optim::AdamW& opt,
                                 const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> out;
  for (const auto& p : ps) {
    out.push_back(p.clone());
    const at::Tensor m = opt.master_weight(p);
    out.push_back(m.defined() ? m.clone() : at::Tensor());
  }
  for (const auto& kv : opt.state()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
    out.push_back(st.exp_avg().clone());
    out.push_back(torch::tensor(st.step()));
  }
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].defined(), b[i].defined()) << i;
    if (a[i].defined()) {
      EXPECT_TRUE(a[i].equal(b[i])) << "state tensor " << i << " changed";
    }
  }
}

TEST(MasterWeights, BadInputIsATypedErrorThatChangesNothing) {
  const std::string path = ::testing::TempDir() + "torchamp_masters_bad.pt";
  auto low = make_params(at::kHalf, 3);
  torchamp::optim::AdamW with(low, torch::optim::AdamWOptions(1e-2), kMasters);
  for (auto& p : low) {
    p.mutable_grad() = torch::randn(p.sizes()).to(at::kHalf);
  }
  with.step();
  torch::save(with, path);

  // A master-weights checkpoint into an optimizer without them.
  auto plain_params = make_params(at::kHalf, 3);
  torchamp::optim::AdamW without(plain_params, torch::optim::AdamWOptions(1e-2));
  for (auto& p : plain_params) {
    p.mutable_grad() = torch::randn(p.sizes()).to(at::kHalf);
  }
  without.step();
  const auto without_before = snapshot(without, plain_params);
  EXPECT_THROW(torch::load(without, path), c10::ValueError);
  expect_same(snapshot(without, plain_params), without_before);

  // And the reverse.
  const std::string plain_path = ::testing::TempDir() + "torchamp_masters_plain.pt";
  torch::save(without, plain_path);
  const auto with_before = snapshot(with, low);
  EXPECT_THROW(torch::load(with, plain_path), c10::ValueError);
  expect_same(snapshot(with, low), with_before);
  try {
    torch::load(with, plain_path);
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("master_weights(true)"), std::string::npos) << e.what();
  }

  // A float16 gradient for a float32 parameter: through the scaler and alone.
  auto mixed = make_params(at::kFloat, 4);
  torchamp::optim::AdamW mixed_opt(mixed, torch::optim::AdamWOptions(1e-2), kMasters);
  for (auto& p : mixed) {
    p.mutable_grad() = torch::randn(p.sizes());
  }
  mixed[2].mutable_grad() = torch::randn(mixed[2].sizes()).to(at::kHalf);
  std::vector<at::Tensor> grads_before, params_before;
  for (const auto& p : mixed) {
    params_before.push_back(p.clone());
    grads_before.push_back(p.grad().clone());
  }
  GradScaler scaler;
  try {
    scaler.step(mixed_opt);
    ADD_FAILURE() << "no error";
  } catch (const c10::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("param_groups[0].params[2]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(mixed_opt.step(), c10::NotImplementedError);
  for (size_t i = 0; i < mixed.size(); ++i) {
    EXPECT_TRUE(mixed[i].equal(params_before[i])) << i;
    EXPECT_TRUE(mixed[i].grad().equal(grads_before[i])) << i;
  }
  EXPECT_TRUE(mixed_opt.state().empty());
  // The scaler still takes this iteration (the throw recorded no stage).
  mixed[2].mutable_grad() = grads_before[2].to(at::kFloat);
  EXPECT_TRUE(scaler.step(mixed_opt).has_value());
  scaler.update();

  // The error names the parameter by group and index, also in a later group
  // whose first parameter has no gradient.
  {
    auto g0 = make_params(at::kFloat, 12);
    std::vector<at::Tensor> g1 = {torch::zeros({4}), torch::zeros({4})};
    std::vector<torch::optim::OptimizerParamGroup> groups = {torch::optim::OptimizerParamGroup(g0),
                                                             torch::optim::OptimizerParamGroup(g1)};
    torchamp::optim::SGD grouped(groups, torch::optim::SGDOptions(0.1), kMasters);
    for (auto& p : g0) {
      p.mutable_grad() = torch::zeros_like(p);
    }
    g1[1].mutable_grad() = torch::zeros({4}, at::kHalf);
    try {
      grouped.step();
      ADD_FAILURE() << "no error";
    } catch (const c10::NotImplementedError& e) {
      EXPECT_NE(std::string(e.what()).find("param_groups[1].params[1]"), std::string::npos)
          << e.what();
    }
  }

  // Without master weights a float16 gradient for a float32 parameter is the
  // scaler's ValueError, as PyTorch's.
  auto f32 = make_params(at::kFloat, 5);
  torchamp::optim::AdamW plain(f32, torch::optim::AdamWOptions(1e-2));
  for (auto& p : f32) {
    p.mutable_grad() = torch::randn(p.sizes()).to(at::kHalf);
  }
  EXPECT_THROW(scaler.step(plain), c10::ValueError);
  std::remove(path.c_str());
  std::remove(plain_path.c_str());
}

TEST(MasterWeights, ScalerTakesFloat16GradientsOnlyWhereTheOptimizerTakesTheScale) {
  // Python: fused optimizers see float16 gradients (allow_fp16 on the fused
  // path); unscale_ refuses them ("Attempting to unscale FP16 gradients.").
  auto low = make_params(at::kHalf, 6);
  torchamp::optim::AdamW opt(low, torch::optim::AdamWOptions(1e-2));
  GradScaler scaler(GradScalerOptions().init_scale(256));
  for (auto& p : low) {
    p.mutable_grad() = (torch::randn(p.sizes()) * 256).to(at::kHalf);
  }
  EXPECT_THROW(scaler.unscale_(opt), c10::ValueError);
  EXPECT_TRUE(scaler.step(opt).has_value());  // the earlier throw left the optimizer ready
  scaler.update();
  // The gradients come back unscaled, rounded to float16 once.
  torch::manual_seed(7);
  std::vector<at::Tensor> scaled;
  for (auto& p : low) {
    p.mutable_grad() = (torch::randn(p.sizes()) * 256).to(at::kHalf);
    scaled.push_back(p.grad().clone());
  }
  EXPECT_TRUE(scaler.step(opt).has_value());
  for (size_t i = 0; i < low.size(); ++i) {
    EXPECT_TRUE(low[i].grad().equal(scaled[i].to(at::kFloat).div(256.0f).to(at::kHalf))) << i;
  }
  scaler.update();
}

// clip_grad_norm_ folded into the fused step against unscale_ +
// torch::nn::utils::clip_grad_norm_ + step on a float32 model.
TEST(MasterWeights, ClipFoldedIntoTheStepMatchesUnscaleClipStep) {
  for (double max_norm : {0.5, 1e9}) {
    auto a = make_params(at::kFloat, 8);
    std::vector<at::Tensor> b;
    for (const auto& p : a) {
      b.push_back(p.clone());
    }
    torchamp::optim::AdamW fused(a, torch::optim::AdamWOptions(1e-2));
    torch::optim::AdamW plain(b, torch::optim::AdamWOptions(1e-2));
    GradScaler sa(GradScalerOptions().init_scale(4096)), sb(GradScalerOptions().init_scale(4096));
    for (int s = 0; s < 5; ++s) {
      torch::manual_seed(300 + s);
      for (size_t i = 0; i < a.size(); ++i) {
        a[i].mutable_grad() = torch::randn(a[i].sizes()) * 4096 * 0.05;
        b[i].mutable_grad() = a[i].grad().clone();
      }
      const double norm_a = sa.clip_grad_norm_(fused, max_norm);
      sb.unscale_(plain);
      const double norm_b = torch::nn::utils::clip_grad_norm_(b, max_norm);
      EXPECT_NEAR(norm_a, norm_b, 1e-5 * norm_b) << "step " << s;
      EXPECT_TRUE(sa.step(fused).has_value());
      EXPECT_TRUE(sb.step(plain).has_value());
      sa.update();
      sb.update();
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-5, 1e-6))
            << "max_norm " << max_norm << " step " << s << " tensor " << i << ": "
            << (a[i] - b[i]).abs().max().item<double>();
      }
    }
  }
  // An overflow: the norm is inf/NaN, the step is skipped, nothing changes.
  auto low = make_params(at::kHalf, 9);
  torchamp::optim::AdamW opt(low, torch::optim::AdamWOptions(1e-2), kMasters);
  GradScaler scaler;
  for (auto& p : low) {
    p.mutable_grad() = torch::randn(p.sizes()).to(at::kHalf);
  }
  low[1].mutable_grad()[0] = std::numeric_limits<float>::infinity();
  std::vector<at::Tensor> before;
  for (const auto& p : low) {
    before.push_back(p.clone());
  }
  EXPECT_FALSE(std::isfinite(scaler.clip_grad_norm_(opt, 1.0)));
  EXPECT_FALSE(scaler.step(opt).has_value());
  for (size_t i = 0; i < low.size(); ++i) {
    EXPECT_TRUE(low[i].equal(before[i])) << i;
    EXPECT_FALSE(opt.master_weight(low[i]).defined()) << "a skipped first step made a master";
  }
  scaler.update();
  EXPECT_THROW(scaler.clip_grad_norm_(opt, -1.0), c10::ValueError);
  EXPECT_THROW(scaler.clip_grad_norm_(opt, std::nan("")), c10::ValueError);
  // Twice in one iteration: as unscale_ twice.
  for (auto& p : low) {
    p.mutable_grad() = torch::randn(p.sizes()).to(at::kHalf);
  }
  scaler.clip_grad_norm_(opt, 1.0);
  EXPECT_THROW(scaler.clip_grad_norm_(opt, 1.0), c10::Error);
  EXPECT_THROW(scaler.unscale_(opt), c10::Error);
  EXPECT_TRUE(scaler.step(opt).has_value());
  scaler.update();
}

TEST(MasterWeights, ClipNormIsTheSameBitsOnAnyNumberOfThreads) {
  auto ps = make_params(at::kFloat, 10);
  ps.push_back(torch::randn({1 << 20}));
  for (auto& p : ps) {
    p.mutable_grad() = torch::randn(p.sizes()) * 100;
  }
  std::vector<double> norms;
  for (int n : {1, 2, 3}) {
    const torchamp_test::ScopedThreads threads(n);
    torchamp::optim::AdamW opt(ps, torch::optim::AdamWOptions(0.0));
    GradScaler scaler(GradScalerOptions().init_scale(100));
    norms.push_back(scaler.clip_grad_norm_(opt, 1e9));
  }
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_EQ(norms[0], norms[2]);
}

// Paddle: AmpScaler._unscale splits the gradients by dtype and unscales the
// float16 ones with check_finite_and_unscale: float32 multiply by the float32
// inverse scale, rounded once.
TEST(MasterWeights, PaddleFacadeUnscalesFloat16GradientsAsPaddle) {
  auto low = make_params(at::kHalf, 11);
  torch::optim::SGD opt(low, torch::optim::SGDOptions(0.1));
  torchamp::paddle::GradScaler scaler(true, 1024.0);
  std::vector<at::Tensor> scaled;
  for (auto& p : low) {
    p.mutable_grad() = (torch::randn(p.sizes()) * 1024).to(at::kHalf);
    scaled.push_back(p.grad().clone());
  }
  scaler.unscale_(opt);
  const float inv = static_cast<float>(1.0 / 1024.0);
  for (size_t i = 0; i < low.size(); ++i) {
    EXPECT_TRUE(low[i].grad().equal(scaled[i].to(at::kFloat).mul(inv).to(at::kHalf))) << i;
  }
  EXPECT_TRUE(scaler.step(opt).has_value());
  scaler.update();
  // Paddle's test_nan_inf: a NaN gradient is found, the step skipped, and
  // every parameter unchanged.
  std::vector<at::Tensor> before;
  for (auto& p : low) {
    p.mutable_grad() = torch::randn(p.sizes()).to(at::kHalf);
    before.push_back(p.clone());
  }
  low[4].mutable_grad()[0][0] = std::nan("");
  EXPECT_FALSE(scaler.minimize(opt).has_value());
  for (size_t i = 0; i < low.size(); ++i) {
    EXPECT_TRUE(low[i].equal(before[i])) << i;
  }
  // decr_every_n_nan_or_inf = 2 (the specification's Paddle): counted, not backed off yet.
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.get_decr_count(), 1);
}

// Paddle's test_amp_master_weight.py, ported: Linear(100, 100) with weight 0.5
// and bias 1.0 in float16 (O2), AdamW(lr 0.01, weight decay 0.01) with master
// weights, the Paddle scaler's minimize, loss = mean(output), 4 steps. Paddle
// compares its dygraph and static losses; here the float16 model's masters are
// compared with a float32 model fed the same float16 gradients.
TEST(MasterWeights, PaddleO2MasterWeightLinear) {
  torch::manual_seed(1);
  const at::Tensor x = torch::rand({100, 100}).to(at::kHalf);
  at::Tensor w = torch::full({100, 100}, 0.5, at::kHalf).requires_grad_();
  at::Tensor b = torch::full({100}, 1.0, at::kHalf).requires_grad_();
  at::Tensor w32 = w.detach().to(at::kFloat), b32 = b.detach().to(at::kFloat);
  const auto options = torch::optim::AdamWOptions(0.01).weight_decay(0.01);
  torchamp::optim::AdamW opt({w, b}, options, kMasters);
  torchamp::optim::AdamW ref({w32, b32}, options);
  torchamp::paddle::GradScaler scaler;  // 32768, Paddle 2.x's default
  std::vector<double> losses;
  for (int s = 0; s < 4; ++s) {
    opt.zero_grad();
    // The product in float32 (LibTorch 1.13 has no float16 matmul on the
    // CPU); the casts' backward hands the float16 parameters float16 gradients.
    const at::Tensor loss =
        torch::nn::functional::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat)).mean();
    losses.push_back(loss.item<double>());
    scaler.scale(loss).backward();
    ASSERT_EQ(w.grad().scalar_type(), at::kHalf);
    w32.mutable_grad() = w.grad().to(at::kFloat);
    b32.mutable_grad() = b.grad().to(at::kFloat);
    ASSERT_TRUE(scaler.minimize(opt).has_value());
    GradScaler ref_scaler(GradScalerOptions().init_scale(32768));
    ASSERT_TRUE(ref_scaler.step(ref).has_value());
    EXPECT_TRUE(same_bits(opt.master_weight(w), w32)) << "step " << s;
    EXPECT_TRUE(same_bits(opt.master_weight(b), b32)) << "step " << s;
    EXPECT_TRUE(w.equal(w32.to(at::kHalf))) << "step " << s;
  }
  EXPECT_LT(losses.back(), losses.front());
}

}  // namespace

namespace {

// A model with parameters in two submodules, one that never gets a gradient
// (so has no master), and buffers of a floating and an integer dtype.
struct ExportNet : torch::nn::Module {
  ExportNet(at::ScalarType dtype, int64_t hidden = 8)
      : fc1(register_module("fc1", torch::nn::Linear(4, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 1))),
        unused(register_parameter("unused", torch::randn({3}))),
        running(register_buffer("running", torch::randn({hidden}))),
        count(register_buffer("count", torch::full({1}, 7, torch::kLong))) {
    to(dtype);
    count = count.to(torch::kLong);
  }
  at::Tensor forward(const at::Tensor& x) {
    const auto f = [](const at::Tensor& t) { return t.to(torch::kFloat); };
    const auto h = torch::relu(torch::nn::functional::linear(x, f(fc1->weight), f(fc1->bias)));
    return torch::nn::functional::linear(h, f(fc2->weight), f(fc2->bias));
  }
  torch::nn::Linear fc1, fc2;
  at::Tensor unused, running, count;
};

}  // namespace

TEST(MasterWeights, ExportFloat32CopiesTheMastersIntoAFloat32Twin) {
  for (const auto dtype : {torch::kBFloat16, torch::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    torch::manual_seed(0);
    auto model = std::make_shared<ExportNet>(dtype);
    torchamp::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2), kMasters);
    GradScaler scaler;
    const auto x = torch::randn({64, 4});
    const auto y = x.sum(1, true);
    for (int step = 0; step < 20; ++step) {
      opt.zero_grad();
      scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
      scaler.step(opt);
      scaler.update();
    }
    model->running.add_(0.5);

    auto twin = std::make_shared<ExportNet>(torch::kFloat);
    opt.export_float32(*model, *twin);
    for (const auto& item : model->named_parameters()) {
      SCOPED_TRACE(item.key());
      const at::Tensor master = opt.master_weight(item.value());
      const at::Tensor out = twin->named_parameters()[item.key()];
      EXPECT_EQ(out.scalar_type(), torch::kFloat);
      if (item.key() == "unused") {
        EXPECT_FALSE(master.defined());  // no gradient, no step, no master
        EXPECT_TRUE(torch::equal(out, item.value().to(torch::kFloat)));
      } else {
        ASSERT_TRUE(master.defined());
        EXPECT_TRUE(torch::equal(out, master));
        // The master is more than the parameter widened: its low bits survive.
        EXPECT_FALSE(torch::equal(out, item.value().to(torch::kFloat)));
      }
    }
    EXPECT_TRUE(torch::equal(twin->running, model->running.to(torch::kFloat)));
    EXPECT_EQ(twin->count.scalar_type(), torch::kLong);
    EXPECT_EQ(twin->count.item<int64_t>(), 7);
    // The float32 twin saves and loads like any float32 model, and predicts
    // as the masters do.
    const std::string path = testing::TempDir() + "export_float32.pt";
    torch::save(twin, path);
    auto loaded = std::make_shared<ExportNet>(torch::kFloat);
    torch::load(loaded, path);
    std::remove(path.c_str());
    EXPECT_TRUE(torch::equal(loaded->forward(x), twin->forward(x)));
    EXPECT_LT(
        torch::mse_loss(loaded->forward(x), y).item<double>(),
        torch::mse_loss(std::make_shared<ExportNet>(torch::kFloat)->forward(x), y).item<double>());
  }
}

TEST(MasterWeights, ExportFloat32RefusesAModelOfAnotherShapeChangingNothing) {
  torch::manual_seed(1);
  auto model = std::make_shared<ExportNet>(torch::kBFloat16);
  torchamp::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2), kMasters);
  auto wider = std::make_shared<ExportNet>(torch::kFloat, /*hidden=*/9);
  const auto before = wider->fc1->bias.clone();
  torchamp_test::expect_throws<c10::ValueError>(
      [&] { opt.export_float32(*model, *wider); },
      "export_float32: parameter 'fc1.weight' has shape [8, 4] in the source "
      "module and [9, 4] in the target");
  EXPECT_TRUE(torch::equal(wider->fc1->bias, before));

  auto other = std::make_shared<ExportNet>(torch::kFloat);
  other->register_parameter("extra", torch::zeros({1}));
  torchamp_test::expect_throws<c10::ValueError>([&] { opt.export_float32(*model, *other); },
                                                "the source module has no parameter 'extra'");
  torchamp_test::expect_throws<c10::ValueError>([&] { opt.export_float32(*other, *model); },
                                                "the target module has no parameter 'extra'");
  torch::nn::Linear plain(4, 8);
  torchamp_test::expect_throws<c10::ValueError>([&] { opt.export_float32(*model, *plain); },
                                                "the target module has no parameter 'unused'");
}

// supports_amp_scaling() is a question: with a parameter taken out of the
// optimizer it writes nothing (its master stays until a step's walk,
// prepare_amp_step(), rebuilds the cache and drops it), and it gives the
// walk's answer, including its typed error for a step masters cannot take.
TEST(MasterWeights, SupportsAmpScalingIsAQuestionThatChangesNothing) {
  auto ps = make_params(at::kBFloat16, 31);
  torchamp::optim::AdamW opt(ps, torch::optim::AdamWOptions(1e-3), kMasters);
  for (auto& p : ps) {
    p.mutable_grad() = torch::ones_like(p);
  }
  opt.step();
  const at::Tensor last = ps.back();
  ASSERT_TRUE(opt.master_weight_storage(last).defined());
  opt.param_groups()[0].params().pop_back();
  const auto& asked = opt;  // const: nothing to prepare through
  EXPECT_TRUE(asked.supports_amp_scaling());
  EXPECT_TRUE(opt.master_weight_storage(last).defined()) << "the question dropped a master";
  EXPECT_TRUE(opt.prepare_amp_step());
  EXPECT_FALSE(opt.master_weight_storage(last).defined()) << "the walk kept a removed master";
  // A gradient of another dtype: the same typed error from both.
  ps.front().mutable_grad() = torch::ones({1}, at::kFloat);
  EXPECT_THROW(asked.supports_amp_scaling(), c10::NotImplementedError);
  EXPECT_THROW(opt.prepare_amp_step(), c10::NotImplementedError);
}
