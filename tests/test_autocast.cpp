// torchamp::autocast: sets and restores ATen's autocast state, nests, clears
// the cast cache on the outermost exit, refuses what the LibTorch cannot do.
#include <torchamp/autocast.h>

#include "test_util.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

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

TEST(Autocast, SupportTableMatchesTheLinkedLibTorch) {
  EXPECT_TRUE(autocast::is_supported(torch::kCPU, torch::kBFloat16));
  EXPECT_TRUE(autocast::is_supported(torch::kCUDA, torch::kHalf));
  EXPECT_TRUE(autocast::is_supported(torch::kCUDA, torch::kBFloat16));
  EXPECT_FALSE(autocast::is_supported(torch::kCPU, torch::kFloat));
#if TORCH_VERSION_MAJOR == 1
  EXPECT_FALSE(autocast::is_supported(torch::kCPU, torch::kHalf));
#endif
}

}  // namespace
