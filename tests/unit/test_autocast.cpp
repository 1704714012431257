// torchamp::autocast: sets and restores ATen's autocast state, nests, clears
// the cast cache on the outermost exit, refuses what the LibTorch cannot do.
#include <torchamp/autocast.h>
#include <torchamp/optim.h>

#include "autocast/cpu_dtype.h"
#include "compat/compat.h"
#include "test_util.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

using torchamp::autocast;
using torchamp_test::expect_throws;

TEST(Autocast, CpuDefaultsToBFloat16AndRunsMatmulsInIt) {
  auto a = torch::randn({4, 4});
  auto b = torch::randn({4, 4});
  EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
  {
    autocast guard(torch::kCPU);
    EXPECT_TRUE(autocast::is_enabled(torch::kCPU));
    EXPECT_EQ(autocast::current_dtype(torch::kCPU), torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    EXPECT_EQ(torch::nn::functional::linear(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
}

TEST(Autocast, DefaultDtypes) {
  EXPECT_EQ(autocast::default_dtype(torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(autocast::default_dtype(torch::kCUDA), torch::kHalf);
}

TEST(Autocast, RestoresEnabledDtypeAndCacheAndNests) {
  const bool cache_before = at::autocast::is_autocast_cache_enabled();
  {
    autocast outer(torch::kCPU, torch::kBFloat16, true, /*cache_enabled=*/false);
    EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
    {
      autocast inner(torch::kCPU, std::nullopt, /*enabled=*/false);
      EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
      EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());  // nullopt keeps it
      EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat);
    }
    EXPECT_TRUE(autocast::is_enabled(torch::kCPU));
    EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
  }
  EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
  EXPECT_EQ(at::autocast::is_autocast_cache_enabled(), cache_before);
  EXPECT_EQ(autocast::current_dtype(torch::kCPU), torch::kBFloat16);
}

TEST(AutocastCuda, MatmulsRunInTheGuardsDtypeOnTheGpu) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  auto a = torch::randn({64, 64}, torch::kCUDA);
  auto b = torch::randn({64, 64}, torch::kCUDA);
  {
    autocast guard(torch::kCUDA);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kHalf);
    EXPECT_EQ(torch::nn::functional::linear(a, b).scalar_type(), torch::kHalf);
    // float32-listed ops stay in float32 (softmax), whatever their input
    EXPECT_EQ(torch::softmax(torch::mm(a, b), 1).scalar_type(), torch::kFloat);
  }
  {
    autocast guard(torch::kCUDA, torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  {
    autocast cpu_only(torch::kCPU);  // the CPU guard leaves CUDA ops alone
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat);
}

TEST(Autocast, CudaStateIsIndependentOfCpu) {
  {
    autocast guard(torch::kCUDA, torch::kBFloat16);
    EXPECT_TRUE(autocast::is_enabled(torch::kCUDA));
    EXPECT_EQ(autocast::current_dtype(torch::kCUDA), torch::kBFloat16);
    EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
  }
  EXPECT_FALSE(autocast::is_enabled(torch::kCUDA));
  EXPECT_EQ(autocast::current_dtype(torch::kCUDA), torch::kHalf);
}

TEST(Autocast, OutermostExitClearsTheCastCache) {
  // With the cache on, a leaf float32 weight is cast once and reused inside
  // the region; after the outermost exit a new region casts afresh. The cache
  // holds the bfloat16 copy alive: its use_count tells whether it is cached.
  auto w = torch::randn({4, 4}, torch::requires_grad());
  auto x = torch::randn({4, 4});
  at::Tensor first;
  {
    autocast outer(torch::kCPU, std::nullopt, true, true);
    {
      autocast inner(torch::kCPU, std::nullopt, true, true);
      first = at::autocast::cached_cast(torch::kBFloat16, w, c10::DeviceType::CPU);
      auto again = at::autocast::cached_cast(torch::kBFloat16, w, c10::DeviceType::CPU);
      EXPECT_TRUE(first.is_same(again));
    }
    // The inner exit did not clear: still the same cached copy.
    auto still = at::autocast::cached_cast(torch::kBFloat16, w, c10::DeviceType::CPU);
    EXPECT_TRUE(first.is_same(still));
  }
  {
    autocast guard(torch::kCPU, std::nullopt, true, true);
    auto fresh = at::autocast::cached_cast(torch::kBFloat16, w, c10::DeviceType::CPU);
    EXPECT_FALSE(first.is_same(fresh));
  }
}

TEST(Autocast, UnsupportedDtypeOrDeviceThrowsBeforeChangingAnything) {
  const bool cache_before = at::autocast::is_autocast_cache_enabled();
  expect_throws<c10::ValueError>([] { autocast g(torch::kCPU, torch::kFloat); },
                                 "autocast: dtype Float is not supported on cpu");
  // The version named is the running library's (its build settings), not the header's.
  expect_throws<c10::ValueError>(
      [] { autocast g(torch::kCPU, torch::kFloat); },
      "by the running LibTorch " + torchamp::compat::runtime_torch_version());
  expect_throws<c10::ValueError>([] { autocast g(torch::kCUDA, torch::kDouble); },
                                 "dtype Double is not supported on cuda");
  expect_throws<c10::ValueError>([] { autocast g(torch::kMeta); },
                                 "device_type must be CPU or CUDA, got meta");
  if (!autocast::is_supported(torch::kCPU, torch::kHalf)) {  // LibTorch < 2.2
    expect_throws<c10::ValueError>([] { autocast g(torch::kCPU, torch::kHalf); },
                                   "dtype Half is not supported on cpu");
  } else {
    autocast g(torch::kCPU, torch::kHalf);
    EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kHalf);
  }
  EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
  EXPECT_EQ(autocast::current_dtype(torch::kCPU), torch::kBFloat16);
  EXPECT_EQ(at::autocast::is_autocast_cache_enabled(), cache_before);
  // Nesting depth is intact: a fresh guard still clears on exit (no throw).
  autocast g(torch::kCPU);
}

TEST(Autocast, RuntimeVersionIsTheLoadedLibrarys) {
  // The build settings' TORCH_VERSION of the library the test runs against; the
  // header's major.minor agree with it (the library and headers come together).
  const std::string v = torchamp::compat::runtime_torch_version();
  const std::string header_major_minor =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".";
  EXPECT_EQ(v.rfind(header_major_minor, 0), 0u) << v;
  EXPECT_NE(at::show_config().find("TORCH_VERSION=" + v), std::string::npos);
}

// The state autocast guards change, for comparing before and after.
struct AutocastState {
  bool cpu_enabled, cuda_enabled, cache;
  at::ScalarType cpu_dtype, cuda_dtype;
  AutocastState()
      : cpu_enabled(autocast::is_enabled(torch::kCPU)),
        cuda_enabled(autocast::is_enabled(torch::kCUDA)),
        cache(at::autocast::is_autocast_cache_enabled()),
        cpu_dtype(autocast::current_dtype(torch::kCPU)),
        cuda_dtype(autocast::current_dtype(torch::kCUDA)) {}
  bool operator==(const AutocastState& o) const {
    return cpu_enabled == o.cpu_enabled && cuda_enabled == o.cuda_enabled && cache == o.cache &&
           cpu_dtype == o.cpu_dtype && cuda_dtype == o.cuda_dtype;
  }
};

TEST(AutocastExit, RestoresExactlyAndIsIdempotent) {
  const AutocastState before;
  autocast guard(torch::kCPU, torch::kBFloat16, true, /*cache_enabled=*/!before.cache);
  EXPECT_TRUE(guard.is_active());
  auto out = torch::mm(torch::ones({2, 2}), torch::ones({2, 2}));
  guard.exit();
  EXPECT_FALSE(guard.is_active());
  EXPECT_TRUE(AutocastState() == before);
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);  // computed under the guard, alive after it
  EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat);
  guard.exit();  // a second exit, and the destructor, do nothing
  EXPECT_TRUE(AutocastState() == before);
}

TEST(AutocastExit, InnerExitGivesBackTheOutersDtypeAndFlag) {
  const AutocastState before;
  autocast outer(torch::kCPU, torch::kBFloat16, true, /*cache_enabled=*/false);
  const AutocastState in_outer;
  {
    autocast inner(torch::kCPU, torch::kBFloat16, /*enabled=*/false, /*cache_enabled=*/true);
    autocast cuda(torch::kCUDA, torch::kBFloat16);
    cuda.exit();
    EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
    inner.exit();
    EXPECT_TRUE(AutocastState() == in_outer);
  }
  EXPECT_TRUE(AutocastState() == in_outer);  // the destructors did nothing more
  outer.exit();
  EXPECT_TRUE(AutocastState() == before);
}

TEST(AutocastExit, OuterExitWhileAnInnerIsActiveThrowsAndChangesNothing) {
  const AutocastState before;
  autocast outer(torch::kCPU);
  autocast inner(torch::kCUDA, torch::kBFloat16);
  const AutocastState in_inner;
  expect_throws<c10::Error>([&] { outer.exit(); },
                            "a guard for cuda constructed after this cpu guard is still active");
  EXPECT_TRUE(outer.is_active());
  EXPECT_TRUE(AutocastState() == in_inner);
  inner.exit();
  outer.exit();
  EXPECT_TRUE(AutocastState() == before);
}

TEST(AutocastExit, OutOfOrderDestructionStillRestoresTheStateBeforeBoth) {
  // Only heap-held guards can end out of order: the outer one's destructor
  // cannot throw, so it hands what it saved to the guard above it.
  const AutocastState before;
  auto outer = std::make_unique<autocast>(torch::kCPU, torch::kBFloat16, true, !before.cache);
  auto inner = std::make_unique<autocast>(torch::kCPU, /*enabled=*/false);
  const AutocastState in_inner;
  outer.reset();
  EXPECT_TRUE(AutocastState() == in_inner);  // the inner guard is still in effect
  inner.reset();
  EXPECT_TRUE(AutocastState() == before);
  autocast fresh(torch::kCPU);  // this thread's chain of guards is intact
  fresh.exit();
  EXPECT_TRUE(AutocastState() == before);
}

TEST(AutocastForms, DeviceAndFlagOnlyConstructors) {
  const torch::Device device("cpu");
  {
    autocast guard(device);  // a c10::Device, as every program has
    EXPECT_TRUE(autocast::is_enabled(torch::kCPU));
    EXPECT_EQ(autocast::current_dtype(torch::kCPU), torch::kBFloat16);
  }
  for (bool use_amp : {true, false}) {
    autocast guard(device, use_amp);  // Python's autocast(device_type, enabled=use_amp)
    EXPECT_EQ(autocast::is_enabled(torch::kCPU), use_amp);
    autocast same(device.type(), use_amp);
    EXPECT_EQ(autocast::is_enabled(torch::kCPU), use_amp);
  }
  {
    autocast guard(device, torch::kBFloat16, true, false);  // the full form with a Device
    EXPECT_FALSE(at::autocast::is_autocast_cache_enabled());
  }
  expect_throws<c10::ValueError>([] { autocast g(torch::Device("meta")); },
                                 "device_type must be CPU or CUDA, got meta");
  EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
}

// The quickstart's loop (examples/quickstart.cpp, on the CPU) with the guard
// ended by exit() and, as before, by the end of a block: the same losses,
// scales and parameters, bit for bit.
struct QuickstartRun {
  std::vector<float> losses;
  std::vector<double> scales;
  std::vector<torch::Tensor> params;
};

QuickstartRun run_quickstart(bool use_exit) {
  torch::manual_seed(0);
  const torch::Device device(torch::kCPU);
  torch::nn::Linear model(4, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> dataloader;
  for (int i = 0; i < 5; ++i) {
    dataloader.emplace_back(torch::randn({8, 4}, device), torch::randn({8, 1}, device));
  }
  torchamp::GradScaler scaler;
  QuickstartRun run;
  for (auto& [x, y] : dataloader) {
    optimizer.zero_grad();
    torch::Tensor loss;
    if (use_exit) {
      autocast guard(device);
      auto out = model->forward(x);
      guard.exit();
      EXPECT_FALSE(autocast::is_enabled(torch::kCPU));
      loss = torch::nn::functional::mse_loss(out.to(torch::kFloat), y);
    } else {
      torch::Tensor out;
      {
        autocast guard(device.type());
        out = model->forward(x);
      }
      loss = torch::nn::functional::mse_loss(out.to(torch::kFloat), y);
    }
    EXPECT_EQ(loss.scalar_type(), torch::kFloat);
    scaler.scale(loss).backward();
    scaler.step(optimizer);
    scaler.update();
    run.losses.push_back(loss.item<float>());
    run.scales.push_back(scaler.get_scale());
  }
  for (const auto& p : model->parameters()) {
    run.params.push_back(p.detach().clone());
  }
  return run;
}

TEST(AutocastExit, QuickstartWithoutHoistingMatchesTheScopedForm) {
  const auto with_exit = run_quickstart(true);
  const auto scoped = run_quickstart(false);
  EXPECT_EQ(with_exit.losses, scoped.losses);
  EXPECT_EQ(with_exit.scales, scoped.scales);
  ASSERT_EQ(with_exit.params.size(), scoped.params.size());
  for (size_t i = 0; i < scoped.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(with_exit.params[i], scoped.params[i])) << "parameter " << i;
  }
}

TEST(Autocast, SupportTableMatchesTheLinkedLibTorch) {
  EXPECT_TRUE(autocast::is_supported(torch::kCPU, torch::kBFloat16));
  EXPECT_TRUE(autocast::is_supported(torch::kCUDA, torch::kHalf));
  EXPECT_TRUE(autocast::is_supported(torch::kCUDA, torch::kBFloat16));
  EXPECT_FALSE(autocast::is_supported(torch::kCPU, torch::kFloat));
#if TORCH_VERSION_MAJOR == 1
  EXPECT_FALSE(autocast::is_supported(torch::kCPU, torch::kHalf));
#endif
}

TEST(CpuHasFast, FollowsTheCpusNativeMatmulInstructions) {
  using torchamp::detail::cpu_has_fast;
  using Features = torchamp::kernels::CpuFeatures;
  Features none;
  EXPECT_TRUE(cpu_has_fast(torch::kFloat, none));
  EXPECT_TRUE(cpu_has_fast(torch::kDouble, none));
  EXPECT_FALSE(cpu_has_fast(torch::kBFloat16, none));
  EXPECT_FALSE(cpu_has_fast(torch::kHalf, none));
  // AVX-512 alone (emulated bfloat16 in oneDNN) is not native.
  Features f = none;
  f.avx2_f16c = f.avx512 = true;
  EXPECT_FALSE(cpu_has_fast(torch::kBFloat16, f));
  // Each native feature alone makes its own dtype fast, not the other one.
  struct Case {
    bool Features::*feature;
    at::ScalarType fast, other;
  };
  for (const Case& c : {Case{&Features::avx512_bf16, torch::kBFloat16, torch::kHalf},
                        Case{&Features::amx_bf16, torch::kBFloat16, torch::kHalf},
                        Case{&Features::arm_bf16, torch::kBFloat16, torch::kHalf},
                        Case{&Features::avx512_fp16, torch::kHalf, torch::kBFloat16},
                        Case{&Features::amx_fp16, torch::kHalf, torch::kBFloat16},
                        Case{&Features::arm_fp16, torch::kHalf, torch::kBFloat16}}) {
    Features one = none;
    one.*c.feature = true;
    EXPECT_TRUE(cpu_has_fast(c.fast, one)) << c.fast;
    EXPECT_FALSE(cpu_has_fast(c.other, one)) << c.fast;
  }
  // The public query reads this CPU's features.
  for (auto dtype : {torch::kBFloat16, torch::kHalf, torch::kFloat}) {
    EXPECT_EQ(torchamp::cpu_has_fast(dtype), cpu_has_fast(dtype, torchamp::kernels::cpu_features()))
        << dtype;
  }
  expect_throws<c10::ValueError>([] { torchamp::cpu_has_fast(torch::kInt); },
                                 "cpu_has_fast: dtype Int is not a floating-point type");
}

TEST(SlowCpuWarning, SaysWhatIsSlowWhyAndHowToSilenceIt) {
  const std::string bf16 = torchamp::detail::slow_cpu_warning(torch::kBFloat16, "autocast");
  for (const char* needle :
       {"autocast puts CPU matmuls in bfloat16", "no native bfloat16", "AVX-512 BF16", "AMX-BF16",
        "slower than float32", "memory still shrinks", "torchamp::cpu_has_fast(dtype)",
        "torchamp::set_slow_cpu_warning(false)", "TORCHAMP_NO_SLOW_CPU_WARNING=1"}) {
    EXPECT_NE(bf16.find(needle), std::string::npos) << needle << " in: " << bf16;
  }
  const std::string fp16 = torchamp::detail::slow_cpu_warning(torch::kHalf, "x");
  EXPECT_NE(fp16.find("no native float16 matrix instructions (AVX-512 FP16 or AMX-FP16"),
            std::string::npos)
      << fp16;
}

TEST(SlowCpuWarning, GivenOncePerDtypeByAutocastOrAFusedOptimizerAndSilencedOnRequest) {
  // A half-precision dtype this CPU is slow at (any CPU without AVX-512 FP16
  // or AMX-FP16 for float16, the x86 CPUs CI runs on among them).
  at::ScalarType slow = torch::kFloat;
  for (auto dtype : {torch::kHalf, torch::kBFloat16}) {
    if (!torchamp::cpu_has_fast(dtype)) {
      slow = dtype;
    }
  }
  if (slow == torch::kFloat) {
    GTEST_SKIP() << "this CPU multiplies both bfloat16 and float16 natively";
  }
  const bool autocasts = autocast::is_supported(torch::kCPU, slow);
  const std::string name = slow == torch::kHalf ? "float16" : "bfloat16";
  // The check is at an optimizer's first step (not at every step).
  auto optimizer_steps = [&] {
    torchamp::optim::SGD opt({torch::zeros({2}, torch::TensorOptions().dtype(slow))},
                             torch::optim::SGDOptions(0.1));
    opt.step();
    opt.step();
  };
  torchamp::compat::WarningCollector warnings;
  torchamp::compat::WarningHandlerGuard installed(&warnings);
  torchamp::set_slow_cpu_warning(true);  // on, and not yet given in this process
  optimizer_steps();
  optimizer_steps();
  if (autocasts) {
    autocast guard(torch::kCPU, slow);
  }
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("half-precision parameters (given to torchamp::optim) puts "
                                      "CPU matmuls in " +
                                      name),
            std::string::npos)
      << warnings.messages[0];
  // float32 parameters and autocast off give none.
  torchamp::set_slow_cpu_warning(true);
  torchamp::optim::SGD fp32({torch::zeros({2})}, torch::optim::SGDOptions(0.1));
  fp32.step();
  if (autocasts) {  // LibTorch 1.13 refuses float16 on the CPU even when disabled
    autocast off(torch::kCPU, slow, /*enabled=*/false);
  }
  EXPECT_EQ(warnings.messages.size(), 1u);
  if (autocasts) {
    { autocast guard(torch::kCPU, slow); }
    ASSERT_EQ(warnings.messages.size(), 2u);
    EXPECT_NE(warnings.messages[1].find("autocast puts CPU matmuls in " + name), std::string::npos)
        << warnings.messages[1];
    { autocast guard(torch::kCPU, slow); }
  }
  // Off: nothing, even where it was never given.
  torchamp::set_slow_cpu_warning(false);
  torchamp::set_slow_cpu_warning(true);
  torchamp::set_slow_cpu_warning(false);
  const size_t before = warnings.messages.size();
  optimizer_steps();
  if (autocasts) {
    autocast guard(torch::kCPU, slow);
  }
  EXPECT_EQ(warnings.messages.size(), before);
  torchamp::set_slow_cpu_warning(true);
}

}  // namespace
