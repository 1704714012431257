// The GradScaler's per-optimizer gradient cache (src/scaler/grad_scaler.cpp): every
// way the optimizer's parameters or gradients can change between steps must
// be noticed, with results bit-identical to unscaling the gradients as they
// are now, the errors and atomicity of the general path, and results that do
// not depend on the number of threads.
#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;
using torchamp_test::expect_throws;

// What unscale_ must leave: float32/bfloat16 in float32 arithmetic (bfloat16
// rounded once), float64 in float64, sparse gradients coalesced.
at::Tensor expected_after(const at::Tensor& grad, float inv) {
  const double d = inv;
  if (grad.is_sparse()) {
    auto c = grad.coalesce();
    return at::sparse_coo_tensor(c._indices(), expected_after(c._values(), inv), c.sizes());
  }
  if (grad.scalar_type() == at::kBFloat16) {
    return grad.to(at::kFloat).mul(d).to(at::kBFloat16);
  }
  return grad.mul(d);
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.is_sparse() || b.is_sparse()) {
    return a.is_sparse() && b.is_sparse() && same_bits(a._indices(), b._indices()) &&
           same_bits(a._values(), b._values());
  }
  auto ca = a.contiguous().cpu();
  auto cb = b.contiguous().cpu();
  return ca.scalar_type() == cb.scalar_type() && ca.sizes() == cb.sizes() &&
         (ca.numel() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0);
}

at::Tensor random_grad(int64_t n, at::ScalarType dtype) {
  return torch::randn({n}).to(dtype);
}

// Optimizer over `sizes.size()` parameters; gradient dtypes cycle through
// float32, bfloat16, float64.
struct Model {
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::SGD> opt;

  explicit Model(const std::vector<int64_t>& sizes) {
    for (int64_t n : sizes) {
      params.push_back(torch::zeros({n}));
    }
    opt = std::make_unique<torch::optim::SGD>(params, 0.1);
  }
  // New gradient tensors, as after zero_grad() (set to none) and backward.
  void fresh_grads(int64_t seed) {
    torch::manual_seed(seed);
    static const at::ScalarType kTypes[] = {at::kFloat, at::kBFloat16, at::kDouble};
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = random_grad(params[i].numel(), kTypes[i % 3]);
    }
  }
  std::vector<at::Tensor> grads() const {
    std::vector<at::Tensor> out;
    for (const auto& group : opt->param_groups()) {
      for (const auto& p : group.params()) {
        out.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
      }
    }
    return out;
  }
  // unscale_ and compare every gradient with what it had to become.
  void unscale_and_check(GradScaler& scaler, const char* what) {
    const auto before = grads();
    const auto inv = static_cast<float>(1.0 / scaler.get_scale());
    scaler.unscale_(*opt);
    const auto after = grads();
    ASSERT_EQ(before.size(), after.size());
    for (size_t i = 0; i < before.size(); ++i) {
      ASSERT_EQ(before[i].defined(), after[i].defined()) << what << ": gradient " << i;
      if (before[i].defined()) {
        EXPECT_TRUE(same_bits(after[i], expected_after(before[i], inv)))
            << what << ": gradient " << i;
      }
    }
  }
};

const std::vector<int64_t> kSizes = {1, 0, 33, 1000, 100, 7, 40000, 2, 100, 65};

TEST(GradCache, FreshGradientsEveryStepAndStableOnesAreUnscaled) {
  Model m(kSizes);
  GradScaler scaler(GradScalerOptions().init_scale(1024.0));
  for (int step = 0; step < 6; ++step) {
    if (step % 2 == 0) {
      m.fresh_grads(step);  // new tensors (zero_grad sets them to none)
    }                       // odd steps: the same tensors, unscaled again
    m.unscale_and_check(scaler, "step");
    EXPECT_TRUE(scaler.non_finite_gradients(*m.opt).empty());
    scaler.update(step % 3 == 0 ? 3.0 : 4096.0);  // inv 1/3 is not a power of two
  }
}

TEST(GradCache, ParameterGroupAddedAfterAStepIsUnscaledAndReported) {
  Model m(kSizes);
  GradScaler scaler;
  m.fresh_grads(1);
  m.unscale_and_check(scaler, "before");
  scaler.update();
  std::vector<at::Tensor> extra = {torch::zeros({5}), torch::zeros({300})};
  m.opt->add_param_group(torch::optim::OptimizerParamGroup(extra));
  m.fresh_grads(2);
  extra[0].mutable_grad() = random_grad(5, at::kFloat);
  extra[1].mutable_grad() = random_grad(300, at::kBFloat16);
  extra[1].mutable_grad()[299] = std::numeric_limits<float>::infinity();
  scaler.register_parameter_name("extra.1", extra[1]);
  m.unscale_and_check(scaler, "after add_param_group");
  const auto bad = scaler.non_finite_gradients(*m.opt);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].group, 1u);
  EXPECT_EQ(bad[0].index, 1u);
  EXPECT_EQ(bad[0].name, "extra.1");
  EXPECT_FALSE(scaler.step(*m.opt).has_value());  // skipped
  scaler.update();
  // A parameter appended to an existing group's list.
  m.opt->param_groups()[0].params().push_back(torch::zeros({9}));
  m.opt->param_groups()[0].params().back().mutable_grad() = random_grad(9, at::kDouble);
  m.unscale_and_check(scaler, "after push_back");
}

TEST(GradCache, GradientOfAnotherDtypeIsFollowedAndAHalfOneRefusedAtomically) {
  Model m(kSizes);
  GradScaler scaler;
  m.fresh_grads(3);
  m.unscale_and_check(scaler, "cached");
  scaler.update();
  m.fresh_grads(4);
  m.params[3].mutable_grad() = random_grad(1000, at::kDouble);   // was float32
  m.params[4].mutable_grad() = random_grad(100, at::kBFloat16);  // was bfloat16, new tensor
  m.params[0].mutable_grad() = random_grad(1, at::kBFloat16);    // was float32
  m.unscale_and_check(scaler, "other dtypes");
  scaler.update();

  m.fresh_grads(5);
  m.params[6].mutable_grad() = random_grad(40000, at::kHalf);
  const auto before = m.grads();
  expect_throws<c10::ValueError>([&] { scaler.unscale_(*m.opt); }, "param_groups[0].params[6]");
  const auto after = m.grads();
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(same_bits(before[i], after[i])) << "gradient " << i << " changed by a throw";
  }
  // The stage did not move: once the gradient is fixed, unscale_ runs.
  m.params[6].mutable_grad() = random_grad(40000, at::kFloat);
  m.unscale_and_check(scaler, "after the refusal");
}

TEST(GradCache, SparseNonContiguousResizedAndDroppedGradients) {
  Model m(kSizes);
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  m.fresh_grads(6);
  m.unscale_and_check(scaler, "cached");
  scaler.update();

  m.fresh_grads(7);
  m.params[3].mutable_grad() = at::sparse_coo_tensor(torch::tensor({{3, 3, 999}}),
                                                     torch::tensor({1.5f, 2.0f, -4.0f}), {1000});
  m.unscale_and_check(scaler, "a sparse gradient appears");
  EXPECT_TRUE(m.params[3].grad().is_coalesced());
  scaler.update();

  m.fresh_grads(8);
  m.params[3].mutable_grad() = torch::randn({40, 25}).t().reshape({-1});  // contiguous copy
  m.params[8].mutable_grad() = torch::randn({10, 10}).t();                // not contiguous
  m.unscale_and_check(scaler, "a non-contiguous gradient");
  scaler.update();

  // The same gradient tensor resized in place (another element count and
  // storage), nothing else changed; then one dropped.
  m.fresh_grads(9);
  m.unscale_and_check(scaler, "cached again");
  scaler.update();
  m.params[2].mutable_grad().resize_({64});
  // (values copied in: normal_() trips a GCC false -Wmaybe-uninitialized
  // inside LibTorch's headers)
  m.params[2].mutable_grad().copy_(torch::randn({64}));
  m.unscale_and_check(scaler, "resized in place");
  scaler.update();
  m.params[5].mutable_grad() = at::Tensor();
  m.unscale_and_check(scaler, "one dropped");
  scaler.update();
  m.params[5].mutable_grad() = random_grad(7, at::kFloat);
  m.unscale_and_check(scaler, "recreated");
}

TEST(GradCache, OptimizerWithoutGradientsAfterACachedStep) {
  Model m(kSizes);
  GradScaler scaler;
  m.fresh_grads(9);
  m.unscale_and_check(scaler, "cached");
  scaler.update();
  m.opt->zero_grad();  // LibTorch 2.x: set to none; 1.13: zeroed in place
  bool any = false;
  for (const auto& p : m.params) {
    any = any || p.grad().defined();
  }
  if (!any) {
    expect_throws<c10::Error>([&] { scaler.step(*m.opt); }, "No inf checks were recorded");
  } else {
    m.unscale_and_check(scaler, "zeroed in place");
  }
}

TEST(GradCache, GradientMovedToCuda) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  Model m(kSizes);
  GradScaler scaler;
  m.fresh_grads(10);
  m.unscale_and_check(scaler, "cached");
  scaler.update();
  m.fresh_grads(11);
  m.params[3].mutable_grad() = random_grad(1000, at::kFloat).cuda();
  m.unscale_and_check(scaler, "one gradient on the GPU");
}

TEST(GradCache, ResultsAndFlagsDoNotDependOnTheThreadCount) {
  // Enough parameters that the walk itself is split, and tensors large
  // enough that the kernel splits within them.
  std::vector<int64_t> sizes;
  for (int i = 0; i < 6000; ++i) {
    sizes.push_back(1 + (i * 37) % 130);
  }
  sizes.push_back(300000);
  std::vector<std::vector<at::Tensor>> results;
  std::vector<std::vector<torchamp::NonFiniteGradient>> reports;
  for (int threads : {1, 2, 3}) {
    const torchamp_test::ScopedThreads scoped(threads);
    Model m(sizes);
    m.fresh_grads(12);
    m.params[4321].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
    m.params[6000].mutable_grad()[250000] = -std::numeric_limits<float>::infinity();
    GradScaler scaler;
    scaler.unscale_(*m.opt);  // builds the cache
    reports.push_back(scaler.non_finite_gradients(*m.opt));
    scaler.update();
    m.fresh_grads(12);
    m.params[17].mutable_grad()[0] = std::numeric_limits<float>::infinity();
    scaler.unscale_(*m.opt);  // through the cache
    reports.push_back(scaler.non_finite_gradients(*m.opt));
    results.push_back(m.grads());
  }
  ASSERT_EQ(reports[0].size(), 2u);
  EXPECT_EQ(reports[0][0].index, 4321u);
  EXPECT_EQ(reports[0][1].index, 6000u);
  ASSERT_EQ(reports[1].size(), 1u);
  EXPECT_EQ(reports[1][0].index, 17u);
  for (size_t r = 2; r < reports.size(); ++r) {
    ASSERT_EQ(reports[r].size(), reports[r % 2].size());
    for (size_t i = 0; i < reports[r].size(); ++i) {
      EXPECT_EQ(reports[r][i].index, reports[r % 2][i].index);
    }
  }
  for (size_t t = 1; t < results.size(); ++t) {
    for (size_t i = 0; i < results[0].size(); ++i) {
      ASSERT_TRUE(same_bits(results[t][i], results[0][i])) << "thread run " << t << " grad " << i;
    }
  }
}

}  // namespace
