// ATen's own AMP ops on CPU tensors: on LibTorch < 2.3 these run torchamp's
// registered kernels, on >= 2.3 ATen's; the semantics tested are PyTorch's.
#include "test_util.h"

#include <torch/torch.h>

#include "compat/compat.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>
#include <string>

namespace {

using torchamp_test::expect_throws;

TEST(AtenAmpOps, ForeachUnscaleOnCpuTensors) {
  std::vector<at::Tensor> grads = {
      torch::tensor({4.0f, -8.0f}), torch::tensor({2.0, 1.0}, torch::kDouble),
      torch::tensor({6.0f}).to(torch::kBFloat16), torch::tensor({10.0f}).to(torch::kHalf)};
  auto found_inf = torch::zeros({1});
  auto inv_scale = torch::full({1}, 0.5f);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  EXPECT_EQ(found_inf.item<float>(), 0.0f);
  EXPECT_TRUE(grads[0].equal(torch::tensor({2.0f, -4.0f})));
  EXPECT_TRUE(grads[1].equal(torch::tensor({1.0, 0.5}, torch::kDouble)));
  EXPECT_EQ(grads[2].item<float>(), 3.0f);
  EXPECT_EQ(grads[3].item<float>(), 5.0f);

  grads[1][0] = std::numeric_limits<double>::quiet_NaN();
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  EXPECT_EQ(found_inf.item<float>(), 1.0f);    // set to exactly 1.0
  EXPECT_EQ(grads[0][0].item<float>(), 1.0f);  // every tensor still unscaled

  // found_inf is only ever set, never cleared, by the op.
  std::vector<at::Tensor> clean = {torch::ones({3})};
  at::_amp_foreach_non_finite_check_and_unscale_(clean, found_inf, inv_scale);
  EXPECT_EQ(found_inf.item<float>(), 1.0f);
}

TEST(AtenAmpOps, ForeachUnscaleChecksItsArguments) {
  std::vector<at::Tensor> grads = {torch::ones({2})};
  auto found = torch::zeros({1});
  expect_throws<c10::Error>(
      [&] { at::_amp_foreach_non_finite_check_and_unscale_(grads, found, torch::ones({2})); },
      "inv_scale must be a 1-element tensor.");
  expect_throws<c10::Error>(
      [&] {
        at::_amp_foreach_non_finite_check_and_unscale_(grads, found,
                                                       torch::ones({1}, torch::kDouble));
      },
      "inv_scale must be a float tensor.");
  auto found_double = torch::zeros({1}, torch::kDouble);
  expect_throws<c10::Error>(
      [&] {
        at::_amp_foreach_non_finite_check_and_unscale_(grads, found_double, torch::ones({1}));
      },
      "found_inf must be a float tensor.");
  std::vector<at::Tensor> ints = {torch::ones({2}), torch::ones({2}, torch::kInt)};
  expect_throws<c10::Error>(
      [&] { at::_amp_foreach_non_finite_check_and_unscale_(ints, found, torch::ones({1})); },
      "not implemented for 'Int'");
  EXPECT_TRUE(ints[0].equal(torch::ones({2})));  // checked before any work
  EXPECT_TRUE(grads[0].equal(torch::ones({2})));
}

TEST(AtenAmpOps, UpdateScaleIsPyTorchsRule) {
  auto scale = torch::full({1}, 1024.0f);
  auto tracker = torch::zeros({1}, torch::kInt);
  auto clean = torch::zeros({1});
  auto inf = torch::ones({1});
  std::vector<float> scales;
  std::vector<int> trackers;
  for (const auto* found : {&clean, &clean, &clean, &inf, &clean}) {
    at::Tensor& result = at::_amp_update_scale_(scale, tracker, *found, 2.0, 0.5, 3);
    EXPECT_TRUE(result.is_same(scale));
    scales.push_back(scale.item<float>());
    trackers.push_back(tracker.item<int>());
  }
  EXPECT_EQ(scales, (std::vector<float>{1024, 1024, 2048, 1024, 1024}));
  EXPECT_EQ(trackers, (std::vector<int>{1, 2, 0, 0, 1}));
  EXPECT_EQ(tracker.scalar_type(), torch::kInt);

  // Never grows to inf; the tracker still resets.
  auto big = torch::full({1}, 3e38f);
  auto t = torch::zeros({1}, torch::kInt);
  at::_amp_update_scale_(big, t, clean, 2.0, 0.5, 1);
  EXPECT_EQ(big.item<float>(), 3e38f);
  EXPECT_EQ(t.item<int>(), 0);
}

TEST(AtenAmpOps, UpdateScaleChecksItsArguments) {
  auto scale = torch::ones({1});
  auto tracker_long = torch::zeros({1}, torch::kLong);
  expect_throws<c10::Error>(
      [&] { at::_amp_update_scale_(scale, tracker_long, torch::zeros({1}), 2.0, 0.5, 1); },
      "growth_tracker must be an int tensor.");
  auto tracker = torch::zeros({1}, torch::kInt);
  auto scale_double = torch::ones({1}, torch::kDouble);
  expect_throws<c10::Error>(
      [&] { at::_amp_update_scale_(scale_double, tracker, torch::zeros({1}), 2.0, 0.5, 1); },
      "current_scale must be a float tensor.");
  EXPECT_EQ(scale.item<float>(), 1.0f);
}

// Which CPU kernel runs: ours below LibTorch 2.3 (ATen had none), ATen's own
// from 2.3 on (ours must not be registered, or it would replace ATen's). The
// dispatcher names the file that registered each kernel.
TEST(AtenAmpOps, OursAreRegisteredOnlyWhereAtenHasNone) {
  for (const char* name :
       {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"}) {
    auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    ASSERT_TRUE(op.has_value()) << name;
    const std::string table = op->dumpComputedTable();
    std::string cpu_line;
    for (size_t pos = 0, end; pos < table.size(); pos = end + 1) {
      end = table.find('\n', pos);
      end = end == std::string::npos ? table.size() : end;
      if (table.compare(pos, 4, "CPU:") == 0) {
        cpu_line = table.substr(pos, end - pos);
      }
    }
    ASSERT_FALSE(cpu_line.empty()) << name << "\n" << table;
    const bool ours = cpu_line.find("aten_amp_ops_cpu.cpp") != std::string::npos;
    EXPECT_EQ(ours, !torchamp::compat::kAtenHasCpuAmpKernels) << name << ": " << cpu_line;
  }
}

}  // namespace
