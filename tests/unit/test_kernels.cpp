// The CPU kernel layer: results bit-identical to the scalar reference, the
// non-finite flag (overall and per tensor) exact, on edge values and on
// tensors large enough to be split across threads.
#include "kernels/bf16.h"
#include "kernels/kernels.h"
#include "test_util.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

namespace {

using torchamp::kernels::check_cpu;
using torchamp::kernels::unscale_cpu_;

// The scalar reference, element by element in opmath, as ATen's kernel.
at::Tensor reference(const at::Tensor& t, float inv) {
  auto flat = t.contiguous().view({-1});
  auto out = torch::empty_like(flat);
  for (int64_t i = 0; i < flat.numel(); ++i) {
    switch (t.scalar_type()) {
      case at::kFloat:
        out.data_ptr<float>()[i] = flat.data_ptr<float>()[i] * inv;
        break;
      case at::kDouble:
        out.data_ptr<double>()[i] = flat.data_ptr<double>()[i] * static_cast<double>(inv);
        break;
      default:
        out.data_ptr<at::BFloat16>()[i] =
            at::BFloat16(static_cast<float>(flat.data_ptr<at::BFloat16>()[i]) * inv);
    }
  }
  return out.view(t.sizes());
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  auto ca = a.contiguous();
  auto cb = b.contiguous();
  return ca.scalar_type() == cb.scalar_type() && ca.numel() == cb.numel() &&
         (ca.numel() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0);
}

// Random values spanning normals, subnormals, +-0, huge values.
at::Tensor random_values(int64_t n, at::ScalarType dtype, int64_t seed) {
  torch::manual_seed(seed);
  auto mant = torch::rand({n}, torch::kDouble) * 2 - 1;
  auto expo = torch::randint(-150, 120, {n}, torch::kDouble);
  auto t = (mant * torch::pow(2.0, expo)).to(dtype);
  if (n > 8) {
    t[1] = 0.0;
    t[2] = -0.0;
    t[3] = std::numeric_limits<float>::denorm_min();
    t[4] = -std::numeric_limits<float>::denorm_min() * 7;
    t[5] = 3.0e38;  // finite in float32 and bfloat16
  }
  return t;
}

// On two threads, so that tensors of a grain or more are split and pieces
// start and end inside them (scripts/test's default is one thread).
class KernelDtype : public ::testing::TestWithParam<at::ScalarType> {
  torchamp_test::ScopedThreads threads_{2};
};
class Kernel : public ::testing::Test {
  torchamp_test::ScopedThreads threads_{2};
};

TEST_P(KernelDtype, BitIdenticalToScalarReferenceAcrossSplits) {
  const auto dtype = GetParam();
  // Sizes around the parallel grain, many small tensors, one empty.
  const std::vector<int64_t> sizes = {1, 7, 100, 0, 32768, 32769, 100000, 3, 250000};
  for (float inv : {1.0f / 65536, 1.0f / 3, 4.0f, 1.0f}) {
    std::vector<at::Tensor> tensors, expected;
    for (size_t i = 0; i < sizes.size(); ++i) {
      tensors.push_back(random_values(sizes[i], dtype, static_cast<int64_t>(i)));
      expected.push_back(reference(tensors.back(), inv));
    }
    std::vector<uint8_t> per_tensor;
    EXPECT_FALSE(unscale_cpu_(tensors, inv, &per_tensor));
    EXPECT_EQ(per_tensor, std::vector<uint8_t>(sizes.size(), 0));
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(tensors[i], expected[i])) << "tensor " << i << " inv " << inv;
    }
  }
}

TEST_P(KernelDtype, NonFiniteAtFirstMiddleLastOfFirstMiddleLastTensor) {
  const auto dtype = GetParam();
  const std::vector<int64_t> sizes = {50000, 1000, 70001};
  const double specials[] = {std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             std::numeric_limits<double>::quiet_NaN()};
  for (size_t which = 0; which < sizes.size(); ++which) {
    for (int64_t pos : {int64_t{0}, sizes[which] / 2, sizes[which] - 1}) {
      for (double special : specials) {
        std::vector<at::Tensor> tensors;
        for (size_t i = 0; i < sizes.size(); ++i) {
          tensors.push_back(random_values(sizes[i], dtype, 10 + static_cast<int64_t>(i)));
        }
        tensors[which][pos] = special;
        std::vector<at::Tensor> expected;
        for (auto& t : tensors) {
          expected.push_back(reference(t, 0.25f));
        }
        std::vector<uint8_t> per_tensor;
        EXPECT_TRUE(check_cpu(tensors, &per_tensor));
        std::vector<uint8_t> want(sizes.size(), 0);
        want[which] = 1;
        EXPECT_EQ(per_tensor, want);
        EXPECT_TRUE(unscale_cpu_(tensors, 0.25f, &per_tensor)) << which << " " << pos;
        EXPECT_EQ(per_tensor, want);
        for (size_t i = 0; i < tensors.size(); ++i) {
          EXPECT_TRUE(bitwise_equal(tensors[i], expected[i]));  // inf/NaN still divided
        }
      }
    }
  }
}

TEST_P(KernelDtype, NonContiguousTensorsAreWrittenBack) {
  const auto dtype = GetParam();
  auto base = random_values(3 * 40000, dtype, 99).view({3, 40000});
  auto view = base.t();  // not contiguous
  auto expected = reference(view, 0.5f);
  view[7][1] = std::numeric_limits<double>::quiet_NaN();
  expected[7][1] = std::numeric_limits<double>::quiet_NaN();
  std::vector<at::Tensor> tensors = {view};
  EXPECT_TRUE(unscale_cpu_(tensors, 0.5f));
  EXPECT_TRUE(bitwise_equal(view, expected));
  EXPECT_TRUE(bitwise_equal(base.t(), expected));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, KernelDtype,
                         ::testing::Values(at::kFloat, at::kDouble, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// bfloat16 has two loops, AVX-512 BF16 (where the CPU has it) and portable:
// the same bits, flags and per-tensor flags from both, on values whose
// products are subnormal (the instruction would flush them), NaNs with
// payloads (it would keep them), infinities, and lengths around the vector
// width. Where the CPU lacks AVX-512 BF16 both runs take the portable loop.
// Every bfloat16 bit pattern (NaNs with every payload, infinities,
// subnormals), starting at an even and at an odd element: the portable loop
// works on pairs of elements, with a single element before and after.
TEST_F(Kernel, Bfloat16EveryBitPatternAtEitherAlignment) {
  for (int64_t offset : {0, 1}) {
    for (float inv : {1.0f / 65536, 1.0f / 3, 4.0f}) {
      at::Tensor all = torch::empty({65536 + 2}, torch::kBFloat16);
      auto* bits = static_cast<uint16_t*>(all.data_ptr());
      for (int64_t i = 0; i < all.numel(); ++i) {
        bits[i] = static_cast<uint16_t>((i - offset) & 0xffff);
      }
      at::Tensor t = all.narrow(0, offset, 65536 + 1);
      const at::Tensor expected = reference(t, inv);
      torchamp::kernels::force_portable(true);
      EXPECT_TRUE(unscale_cpu_({t}, inv));
      torchamp::kernels::force_portable(false);
      EXPECT_TRUE(bitwise_equal(t, expected)) << "offset " << offset << " inv " << inv;
    }
  }
}

// The kernels' branch-free float16 conversions are c10::Half's: every
// float16 pattern one way, bit for bit (NaNs too: payload kept, made quiet,
// as F16C's VCVTPH2PS, which the master-weight vector loops use); every
// float32 pattern in a stride that covers each exponent and the rounding
// bits, and the boundaries, the other way.
TEST_F(Kernel, Float16ConversionsAreC10Halfs) {
  int64_t wrong = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float ours = torchamp::kernels::f16_to_float(static_cast<uint16_t>(h));
    const float c10s = c10::detail::fp16_ieee_to_fp32_value(static_cast<uint16_t>(h));
    wrong += torchamp::kernels::bits_of(ours) != torchamp::kernels::bits_of(c10s);
  }
  EXPECT_EQ(wrong, 0) << "float16 -> float32";
  std::vector<uint32_t> xs;
  for (uint64_t x = 0; x <= 0xffffffffull; x += 4099) {
    xs.push_back(static_cast<uint32_t>(x));
  }
  for (uint32_t base : {0x38800000u, 0x38000000u, 0x33000000u, 0x477fe000u, 0x477ff000u,
                        0x7f800000u, 0x3f800000u}) {
    for (uint32_t d = 0; d < 0x3000u; ++d) {
      xs.push_back(base + d - 0x1800u);
      xs.push_back((base + d - 0x1800u) | 0x80000000u);
    }
  }
  wrong = 0;
  for (uint32_t x : xs) {
    const float f = torchamp::kernels::float_of(x);
    wrong += torchamp::kernels::float_to_f16(f) != c10::detail::fp16_ieee_from_fp32_value(f);
  }
  EXPECT_EQ(wrong, 0) << "float32 -> float16, of " << xs.size();
}

TEST_F(Kernel, Bfloat16FastAndPortableLoopsAgreeBitForBit) {
  RecordProperty("bf16_unscale_path", torchamp::kernels::unscale_path(at::kBFloat16));
  const std::vector<int64_t> sizes = {1,  15, 16, 17,   31,        32,    33,
                                      63, 64, 65, 1000, 32768 + 5, 100003};
  for (float inv : {1.0f / 65536, 1.0f / 3, 3.0e-39f, 1.0e30f}) {
    std::vector<at::Tensor> fast, portable, expected;
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto t = random_values(sizes[i], at::kBFloat16, 1000 + static_cast<int64_t>(i));
      auto bits = t.view(at::kShort);
      const int16_t specials[] = {
          0x7f80, -128 /* 0xff80: -inf */, 0x7fc1, -1 /* 0xffff */, 0x7f81, 0x0001,
          -32767 /* 0x8001 */};
      for (int64_t k = 0; k < static_cast<int64_t>(std::size(specials)) && k < sizes[i]; ++k) {
        bits[(k * 7919) % sizes[i]] = specials[k];
      }
      expected.push_back(reference(t, inv));
      fast.push_back(t);
      portable.push_back(t.clone());
    }
    std::vector<uint8_t> fast_flags, portable_flags;
    const bool fast_found = unscale_cpu_(fast, inv, &fast_flags);
    torchamp::kernels::force_portable(true);
    const bool portable_found = unscale_cpu_(portable, inv, &portable_flags);
    torchamp::kernels::force_portable(false);
    EXPECT_STRNE(torchamp::kernels::unscale_path(at::kBFloat16), "");
    EXPECT_EQ(fast_found, portable_found);
    EXPECT_EQ(fast_flags, portable_flags);
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(fast[i], portable[i])) << "size " << sizes[i] << " inv " << inv;
      EXPECT_TRUE(bitwise_equal(portable[i], expected[i])) << "size " << sizes[i];
    }
  }
}

// float32 has an AVX-512 loop with a masked last vector (where the CPU has
// AVX-512F) and the portable one: the same bits and flags, on lengths around
// both vector widths, with infinities and NaNs at the ends.
TEST_F(Kernel, Float32FastAndPortableLoopsAgreeBitForBit) {
  RecordProperty("float32_unscale_path", torchamp::kernels::unscale_path(at::kFloat));
  const std::vector<int64_t> sizes = {1, 7, 8, 15, 16, 17, 31, 32, 33, 100, 1000, 32768 + 5};
  for (float inv : {1.0f / 65536, 1.0f / 3, 3.0e-39f, 1.0e30f}) {
    for (int special_at : {-1, 0, 1}) {  // none, first element, last element
      std::vector<at::Tensor> fast, portable, expected;
      for (size_t i = 0; i < sizes.size(); ++i) {
        auto t = random_values(sizes[i], at::kFloat, 2000 + static_cast<int64_t>(i));
        if (special_at >= 0 && i % 3 == 0) {
          t[special_at == 0 ? 0 : sizes[i] - 1] = i % 2 ? std::numeric_limits<float>::quiet_NaN()
                                                        : -std::numeric_limits<float>::infinity();
        }
        expected.push_back(reference(t, inv));
        fast.push_back(t);
        portable.push_back(t.clone());
      }
      std::vector<uint8_t> fast_flags, portable_flags;
      const bool fast_found = unscale_cpu_(fast, inv, &fast_flags);
      torchamp::kernels::force_portable(true);
      const bool portable_found = unscale_cpu_(portable, inv, &portable_flags);
      torchamp::kernels::force_portable(false);
      EXPECT_EQ(fast_found, special_at >= 0);
      EXPECT_EQ(fast_found, portable_found);
      EXPECT_EQ(fast_flags, portable_flags);
      for (size_t i = 0; i < sizes.size(); ++i) {
        EXPECT_TRUE(bitwise_equal(fast[i], portable[i])) << "size " << sizes[i] << " inv " << inv;
        EXPECT_TRUE(bitwise_equal(portable[i], expected[i])) << "size " << sizes[i];
      }
    }
  }
}

TEST_F(Kernel, NothingIsWrittenWhenInvScaleIsOne) {
  auto t = torch::tensor({1.0f, std::numeric_limits<float>::infinity()});
  const void* before = t.data_ptr();
  std::vector<at::Tensor> tensors = {t};
  EXPECT_TRUE(unscale_cpu_(tensors, 1.0f));
  EXPECT_EQ(t.data_ptr(), before);
  EXPECT_EQ(t[0].item<float>(), 1.0f);
}

TEST_F(Kernel, EmptyListAndEmptyTensors) {
  std::vector<at::Tensor> none;
  EXPECT_FALSE(unscale_cpu_(none, 0.5f));
  std::vector<at::Tensor> empty = {torch::empty({0}), torch::empty({0, 3})};
  std::vector<uint8_t> per_tensor;
  EXPECT_FALSE(check_cpu(empty, &per_tensor));
  EXPECT_EQ(per_tensor, std::vector<uint8_t>(2, 0));
}

}  // namespace
