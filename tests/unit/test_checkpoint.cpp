// torchamp::checkpoint / checkpoint_sequential: gradients with checkpointing
// are those without, bit for bit, under autocast, dropout, a scaled loss and
// nested guards; Python's non-reentrant rules for grad mode and for segments
// whose inputs need no grad; typed errors that change nothing. (Against
// Python's torch.utils.checkpoint: tests/integration/python/checkpoint_parity.py; under
// DDP: tests/integration/distributed/test_data_parallel.cpp.)
#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>
#include <torchamp/grad_scaler.h>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <limits>

#include "test_util.h"

namespace {

using torchamp_test::expect_throws;

torch::nn::Sequential make_mlp() {
  torch::manual_seed(11);
  return torch::nn::Sequential(
      torch::nn::Linear(16, 64), torch::nn::GELU(), torch::nn::Dropout(0.25),
      torch::nn::Linear(64, 64), torch::nn::Tanh(), torch::nn::Dropout(0.1),
      torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 8));
}

// The CPU autocast dtypes this LibTorch has.
std::vector<at::ScalarType> cpu_dtypes() {
  std::vector<at::ScalarType> out{torch::kBFloat16};
  if (torchamp::autocast::is_supported(torch::kCPU, torch::kHalf)) {
    out.push_back(torch::kHalf);
  }
  return out;
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) {
    out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  return out;
}

void expect_bitwise(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined()) << what << ": tensor " << i << " undefined";
    ASSERT_TRUE(b[i].defined()) << what << ": tensor " << i << " undefined";
    EXPECT_TRUE(a[i].dtype() == b[i].dtype() && a[i].equal(b[i]))
        << what << ": tensor " << i << " differs";
  }
}

struct Run {
  std::vector<torch::Tensor> grads;
  torch::Tensor x_grad, out, rng_after;
};

// One forward and backward of the MLP under `dtype` autocast (none for
// Undefined), checkpointed in `segments` (0: not at all).
Run run_mlp(at::ScalarType dtype, int64_t segments, bool input_grad,
            const torchamp::CheckpointOptions& options = {}) {
  auto model = make_mlp();
  auto x = torch::randn({32, 16}).requires_grad_(input_grad);
  torch::manual_seed(5);
  torch::Tensor out;
  {
    torchamp::autocast guard(torch::kCPU,
                             dtype == at::ScalarType::Undefined ? torch::kBFloat16 : dtype,
                             dtype != at::ScalarType::Undefined);
    out = segments == 0 ? model->forward(x)
                        : torchamp::checkpoint_sequential(model, segments, x, options);
  }
  out.to(torch::kFloat).pow(2).sum().backward();
  return {grads_of(*model), input_grad ? x.grad().clone() : torch::Tensor(), out.detach(),
          torch::rand({4})};
}

TEST(Checkpoint, GradientsEqualWithoutCheckpointingUnderAutocastAndDropout) {
  std::vector<at::ScalarType> dtypes = cpu_dtypes();
  dtypes.push_back(at::ScalarType::Undefined);  // float32
  for (const auto dtype : dtypes) {
    for (const bool input_grad : {false, true}) {
      const auto plain = run_mlp(dtype, 0, input_grad);
      for (const int64_t segments : {2, 3, 9}) {
        const auto what = std::string("dtype ") + c10::toString(dtype) + ", segments " +
                          std::to_string(segments) + ", input grad " + std::to_string(input_grad);
        const auto ckpt = run_mlp(dtype, segments, input_grad);
        EXPECT_TRUE(ckpt.out.equal(plain.out)) << what;
        expect_bitwise(ckpt.grads, plain.grads, what);
        if (input_grad) {
          EXPECT_TRUE(ckpt.x_grad.equal(plain.x_grad)) << what;
        }
        // The recomputation forked the RNG: afterwards it is where the
        // forward left it, as without checkpointing.
        EXPECT_TRUE(ckpt.rng_after.equal(plain.rng_after)) << what;
      }
    }
  }
}

// Python's reentrant form gives the first segment's parameters no gradient
// when the input needs none; the non-reentrant form (and this) does.
TEST(Checkpoint, FirstSegmentOnAPlainInputStillGivesItsParametersGradients) {
  auto model = make_mlp();
  const auto x = torch::randn({8, 16});
  torch::manual_seed(1);
  torchamp::checkpoint_sequential(model, 3, x).sum().backward();
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(p.value().grad().defined()) << p.key();
  }
}

TEST(Checkpoint, WithoutPreserveRngStateTheRecomputationDrawsOtherMasks) {
  const auto plain = run_mlp(torch::kBFloat16, 0, false);
  const auto ckpt =
      run_mlp(torch::kBFloat16, 2, false, torchamp::CheckpointOptions().preserve_rng_state(false));
  EXPECT_TRUE(ckpt.out.equal(plain.out));  // the forward is the same
  EXPECT_FALSE(ckpt.grads[0].equal(plain.grads[0]));
}

// A scaled loss; the GradScaler steps, and skips the step whose batch holds
// an inf, with and without checkpointing to the same bits.
TEST(Checkpoint, ScaledLossTheScalerStepsAndSkipsAlike) {
  for (const auto dtype : cpu_dtypes()) {
    std::vector<std::vector<torch::Tensor>> params;
    std::vector<std::vector<double>> scales;
    for (const int64_t segments : {0, 3}) {
      auto model = make_mlp();
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
      torchamp::GradScaler scaler(
          torchamp::GradScalerOptions().init_scale(4096).growth_interval(2));
      std::vector<double> s;
      torch::manual_seed(3);
      for (int step = 0; step < 6; ++step) {
        auto x = torch::randn({16, 16});
        if (step == 3) {
          x[2][5] = std::numeric_limits<float>::infinity();
        }
        opt.zero_grad();
        torch::Tensor loss;
        {
          torchamp::autocast guard(torch::kCPU, dtype);
          const auto out = segments == 0 ? model->forward(x)
                                         : torchamp::checkpoint_sequential(model, segments, x);
          loss = out.to(torch::kFloat).pow(2).mean();
        }
        scaler.scale(loss).backward();
        const bool stepped = scaler.step(opt).has_value();
        scaler.update();
        EXPECT_EQ(stepped, step != 3) << "step " << step;
        s.push_back(scaler.get_scale());
      }
      std::vector<torch::Tensor> p;
      for (const auto& t : model->parameters()) {
        p.push_back(t.detach().clone());
      }
      params.push_back(p);
      scales.push_back(s);
    }
    expect_bitwise(params[1], params[0], c10::toString(dtype));
    EXPECT_EQ(scales[1], scales[0]);
  }
}

// The forward ran under nested guards (CUDA's, which a CPU model ignores,
// around CPU's); inside the segment a guard turns CPU autocast off for one
// layer and on at another dtype for the next. The recomputation sees the
// same state at every point.
TEST(Checkpoint, NestedGuardsAndASegmentThatExitsAutocastReplayExactly) {
  for (const auto dtype : cpu_dtypes()) {
    std::vector<std::string> seen;
    torch::manual_seed(2);
    torch::nn::Linear a(16, 32), b(32, 32), c(32, 4);
    const auto segment = [&](const torch::Tensor& x) {
      seen.push_back(std::to_string(torchamp::autocast::is_enabled(torch::kCPU)) +
                     c10::toString(torchamp::autocast::current_dtype(torch::kCPU)) +
                     std::to_string(torchamp::autocast::is_enabled(torch::kCUDA)) +
                     std::to_string(at::autocast::is_autocast_cache_enabled()));
      auto h = a(x).relu();
      {
        torchamp::autocast off(torch::kCPU, false);  // Python: autocast(enabled=False)
        h = b(h.to(torch::kFloat));
        EXPECT_EQ(h.scalar_type(), torch::kFloat);
      }
      {
        torchamp::autocast other(torch::kCPU, torch::kBFloat16);
        h = c(h.tanh());
      }
      return h;
    };
    const auto x = torch::randn({8, 16});
    std::vector<std::vector<torch::Tensor>> grads;
    for (const bool ckpt : {false, true}) {
      for (auto* m : {a.ptr().get(), b.ptr().get(), c.ptr().get()}) {
        m->zero_grad();
      }
      torch::Tensor out;
      {
        torchamp::autocast cuda(torch::kCUDA, torch::kHalf);
        torchamp::autocast cpu(torch::kCPU, dtype, true, /*cache_enabled=*/false);
        out = ckpt ? torchamp::checkpoint(segment, x) : segment(x);
      }
      EXPECT_FALSE(torchamp::autocast::is_enabled(torch::kCPU));
      out.to(torch::kFloat).sum().backward();
      std::vector<torch::Tensor> g;
      for (auto* m : {a.ptr().get(), b.ptr().get(), c.ptr().get()}) {
        for (const auto& p : m->parameters()) {
          g.push_back(p.grad().clone());
        }
      }
      grads.push_back(g);
    }
    expect_bitwise(grads[1], grads[0], c10::toString(dtype));
    ASSERT_EQ(seen.size(), 3u);  // plain, checkpointed forward, recomputation
    EXPECT_EQ(seen[1], seen[0]);
    EXPECT_EQ(seen[2], seen[0]) << "the recomputation ran under another autocast state";
    EXPECT_EQ(seen[0], std::string("1") + c10::toString(dtype) + "10");
  }
}

// checkpoint(fn, x, y) with a tuple result; a module holder as the function;
// tensors the function captures (a leaf and a non-leaf) get their gradients
// through torch::autograd::grad.
TEST(Checkpoint, VariadicTupleModuleHolderAndCapturedTensors) {
  torch::manual_seed(4);
  torch::nn::Linear lin(8, 8);
  auto w = torch::randn({8}, torch::requires_grad());
  const auto x = torch::randn({4, 8}, torch::requires_grad());
  const auto y = torch::randn({4, 8});
  std::vector<std::vector<torch::Tensor>> results;
  for (const bool ckpt : {false, true}) {
    const auto w2 = w * 2;  // a non-leaf the function captures
    const auto fn = [&](const torch::Tensor& a, const torch::Tensor& b) {
      const auto h = lin(a) * w2 + b;
      return std::make_tuple(h.sin(), (h * b).sum());
    };
    const auto [u, v] = ckpt ? torchamp::checkpoint(fn, x, y) : fn(x, y);
    const auto z = ckpt ? torchamp::checkpoint(lin, u) : lin(u);
    auto g = torch::autograd::grad({z.sum() + v}, {x, w, lin->weight, lin->bias});
    results.push_back(g);
  }
  expect_bitwise(results[1], results[0], "grad");
}

// A parameter used in two checkpointed segments accumulates once per use,
// as without checkpointing.
TEST(Checkpoint, AParameterInSeveralSegments) {
  torch::manual_seed(6);
  torch::nn::Linear shared(16, 16), head(16, 2);
  torch::nn::Sequential model(shared, torch::nn::Tanh(), shared, torch::nn::Tanh(), head);
  const auto x = torch::randn({8, 16});
  std::vector<std::vector<torch::Tensor>> grads;
  for (const int64_t segments : {0, 5}) {
    model->zero_grad();
    const auto out =
        segments ? torchamp::checkpoint_sequential(model, segments, x) : model->forward(x);
    out.pow(2).sum().backward();
    grads.push_back(grads_of(*model));
  }
  expect_bitwise(grads[1], grads[0], "shared");
  // Under autocast with the cast cache, the second segment's forward finds
  // the first one's cast of the weight in the cache, and its recomputation
  // casts again: the same gradients up to where the float32 sum happens
  // (docs/activation-checkpointing.md).
  std::vector<std::vector<torch::Tensor>> amp;
  for (const int64_t segments : {0, 5}) {
    model->zero_grad();
    torch::Tensor out;
    {
      torchamp::autocast guard(torch::kCPU, torch::kBFloat16);
      out = segments ? torchamp::checkpoint_sequential(model, segments, x) : model->forward(x);
    }
    out.to(torch::kFloat).pow(2).sum().backward();
    amp.push_back(grads_of(*model));
  }
  for (size_t i = 0; i < amp[0].size(); ++i) {
    EXPECT_TRUE(amp[1][i].allclose(amp[0][i], 1e-2, 1e-3)) << "parameter " << i;
  }
}

TEST(Checkpoint, RetainGraphBackwardTwice) {
  torch::manual_seed(7);
  torch::nn::Linear lin(4, 4);
  const auto x = torch::randn({3, 4}, torch::requires_grad());
  const auto fn = [&](const torch::Tensor& a) { return lin(a).tanh(); };
  std::vector<torch::Tensor> r;
  for (const bool ckpt : {false, true}) {
    lin->zero_grad();
    const auto out = ckpt ? torchamp::checkpoint(fn, x) : fn(x);
    out.sum().backward({}, /*retain_graph=*/true);
    out.sum().backward();
    r.push_back(lin->weight.grad().clone());
  }
  EXPECT_TRUE(r[1].equal(r[0]));
}

// What this construction cannot do says so instead of giving wrong
// gradients: higher-order gradients through a segment, and a captured
// non-leaf whose history reaches another tensor the function uses.
TEST(Checkpoint, UnsupportedUsesAreNotImplementedErrors) {
  torch::nn::Linear lin(4, 4);
  const auto x = torch::randn({3, 4}, torch::requires_grad());
  const auto y = torchamp::checkpoint([&](const torch::Tensor& a) { return lin(a).tanh(); }, x);
  expect_throws<c10::NotImplementedError>(
      [&] { torch::autograd::grad({y.pow(3).sum()}, {x}, {}, true, true); }, "create_graph=true");
  const auto w = torch::randn({4}, torch::requires_grad());
  const auto w2 = w * 2;
  expect_throws<c10::NotImplementedError>(
      [&] { torchamp::checkpoint([&](const torch::Tensor& a) { return a * w2 + w; }, x); },
      "pass that tensor as an input");
  // Outputs that share memory, and a function that changes its input in
  // place, would give wrong gradients silently: refused.
  expect_throws<c10::NotImplementedError>(
      [&] {
        torchamp::checkpoint(
            [&](const torch::Tensor& a) {
              const auto h = lin(a);
              return std::make_tuple(h, h[0]);
            },
            x);
      },
      "outputs 0 and 1 share memory");
  auto z = torch::randn({3, 4});
  expect_throws<c10::Error>(
      [&] { torchamp::checkpoint([&](const torch::Tensor& a) { return lin(a.mul_(2)); }, z); },
      "modified its input 0 in place");
  // As an input it works.
  const auto out = torchamp::checkpoint(
      [&](const torch::Tensor& a, const torch::Tensor& b) { return a * b + w; }, x, w2);
  out.sum().backward();
  EXPECT_TRUE(w.grad().allclose(x.detach().sum(0) * 2 + 3));
}

// A hook on a parameter and retain_grad on a captured tensor run once, as
// without checkpointing (LibTorch 2.x's engine also runs a node's tensor
// hooks where torch::autograd::grad captures at it).
TEST(Checkpoint, TensorHooksRunOnce) {
  torch::manual_seed(8);
  torch::nn::Linear lin(4, 4);
  const auto x = torch::randn({3, 4});
  const auto shift = torch::randn({4}, torch::requires_grad());
  std::vector<torch::Tensor> g;
  for (const bool ckpt : {false, true}) {
    lin->zero_grad();
    int calls = 0;
    auto handle = lin->weight.register_hook([&](const torch::Tensor& grad) {
      ++calls;
      return grad * 2;
    });
    auto captured = shift * 3;
    captured.retain_grad();
    const auto fn = [&](const torch::Tensor& a) { return (lin(a) + captured).tanh(); };
    (ckpt ? torchamp::checkpoint(fn, x) : fn(x)).sum().backward();
    lin->weight.remove_hook(handle);
    EXPECT_EQ(calls, 1) << "checkpointed " << ckpt;
    g.push_back(lin->weight.grad().clone());
    g.push_back(captured.grad().clone());
  }
  EXPECT_TRUE(g[2].equal(g[0]));
  EXPECT_TRUE(g[3].equal(g[1]));
}

// Python's grad-mode rules: under no_grad or inference mode the function
// just runs; with nothing requiring grad the outputs require none.
TEST(Checkpoint, GradModeAndInferenceModeRules) {
  torch::nn::Linear lin(4, 4);
  const auto x = torch::randn({2, 4});
  int calls = 0;
  const auto fn = [&](const torch::Tensor& a) {
    ++calls;
    return lin(a);
  };
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(torchamp::checkpoint(fn, x).requires_grad());
  }
  {
    c10::InferenceMode inference;
    const auto out = torchamp::checkpoint(fn, x);
    EXPECT_FALSE(out.requires_grad());
    EXPECT_TRUE(out.is_inference());
  }
  const auto plain = [&](const torch::Tensor& a) { return a * 2; };
  EXPECT_FALSE(torchamp::checkpoint(plain, x).requires_grad());
  EXPECT_EQ(calls, 2);
  const auto out = torchamp::checkpoint(fn, x);
  EXPECT_TRUE(out.requires_grad());
  EXPECT_EQ(out.grad_fn()->name(), "torchamp::CheckpointBackward");
}

TEST(Checkpoint, BadInputIsATypedErrorThatChangesNothing) {
  auto model = make_mlp();
  const auto x = torch::randn({2, 16});
  const auto dtype_before = torch::get_default_dtype();
  const auto before = at::detail::getDefaultCPUGenerator().get_state();
  expect_throws<c10::TypeError>(
      [&] { torchamp::checkpoint(torchamp::CheckpointFunction(), std::vector<torch::Tensor>{x}); },
      "function is empty");
  torch::Tensor (*null_fn)(const torch::Tensor&) = nullptr;
  expect_throws<c10::TypeError>([&] { torchamp::checkpoint(null_fn, x); }, "function is empty");
  expect_throws<c10::TypeError>([&] { torchamp::checkpoint(torch::nn::Linear(nullptr), x); },
                                "function is empty");
  expect_throws<c10::TypeError>(
      [&] { torchamp::checkpoint_sequential(torch::nn::Sequential(nullptr), 1, x); },
      "holder is empty");
  expect_throws<c10::ValueError>([&] { torchamp::checkpoint_sequential(model, 0, x); },
                                 "segments must be at least 1, got 0");
  expect_throws<c10::ValueError>([&] { torchamp::checkpoint_sequential(model, -2, x); }, "got -2");
  expect_throws<c10::ValueError>([&] { torchamp::checkpoint_sequential(model, 10, x); },
                                 "10 segments for a Sequential of 9 modules");
  expect_throws<c10::ValueError>(
      [&] { torchamp::checkpoint_sequential(torch::nn::Sequential(), 1, x); },
      "1 segments for a Sequential of 0 modules");
  expect_throws<c10::ValueError>(
      [&] {
        torchamp::checkpoint_sequential(model, 2, x,
                                        torchamp::CheckpointOptions().determinism_check("all"));
      },
      "determinism_check must be \"default\" or \"none\", got \"all\"");
  EXPECT_TRUE(at::detail::getDefaultCPUGenerator().get_state().equal(before));
  EXPECT_EQ(torch::get_default_dtype(), dtype_before);
  for (const auto& p : model->parameters()) {
    EXPECT_FALSE(p.grad().defined());
  }
}

// Backward's checks: an input changed in place since the forward, a second
// backward without retain_graph, a recomputation that differs.
TEST(Checkpoint, BackwardRefusesWhatItCannotRecompute) {
  torch::nn::Linear lin(4, 4);
  auto x = torch::randn({2, 4});
  const auto fn = [&](const torch::Tensor& a) { return lin(a); };
  auto out = torchamp::checkpoint(fn, x);
  x.mul_(2);
  expect_throws<c10::Error>([&] { out.sum().backward(); },
                            "modified by an inplace operation: torchamp::checkpoint's input 0");
  x = torch::randn({2, 4});
  out = torchamp::checkpoint(fn, x);
  out.sum().backward();
  expect_throws<c10::Error>([&] { out.sum().backward(); }, "a second time");
  int calls = 0;
  const auto changing = [&](const torch::Tensor& a) { return ++calls == 1 ? lin(a) : lin(a)[0]; };
  out = torchamp::checkpoint(changing, x);
  expect_throws<c10::Error>([&] { out.sum().backward(); }, "recomputed output 0 is");
  calls = 0;
  out = torchamp::checkpoint(changing, x, torchamp::CheckpointOptions().determinism_check("none"));
  EXPECT_NO_THROW(out.sum().backward());  // (the engine sums the gradient to the new shape)
}

TEST(CheckpointCuda, GradientsEqualWithoutCheckpointingUnderFloat16AndDropout) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  std::vector<std::vector<torch::Tensor>> grads;
  std::vector<torch::Tensor> rng;
  for (const int64_t segments : {0, 3}) {
    auto model = make_mlp();
    model->to(torch::kCUDA);
    const auto x = torch::randn({32, 16}, torch::kCUDA);
    torch::manual_seed(5);
    torch::Tensor out;
    {
      torchamp::autocast guard(torch::kCUDA);
      out = segments ? torchamp::checkpoint_sequential(model, segments, x) : model->forward(x);
    }
    out.to(torch::kFloat).pow(2).sum().backward();
    grads.push_back(grads_of(*model));
    rng.push_back(torch::rand({4}, torch::kCUDA).cpu());
  }
  expect_bitwise(grads[1], grads[0], "cuda float16");
  EXPECT_TRUE(rng[1].equal(rng[0]));
}

}  // namespace
