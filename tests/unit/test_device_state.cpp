// A GradScaler whose state lives on a device (GradScalerOptions().device_state
// on the CPU: the code a CUDA scaler runs): the same schedule, skips and
// parameters as the host scaler step for step, no host read inside an
// iteration (counted with a RecordFunction observer), and reads only where
// the program asks (getters, state_dict, StepResult, a checkpoint's step
// counts).

#include "test_util.h"

#include <torchamp/config.h>  // TORCHAMP_WITH_CUDA
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>
#include <torchamp/paddle.h>

#include "compat/compat.h"  // kAtenFusedOptimizers, optim_state_key

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#if TORCHAMP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;
using torchamp::optim::FusedOptions;

// Counts, while it lives, what makes a step wait on the host or move data
// between devices: the reads of a tensor back to the host (ATen's
// _local_scalar_dense, which item() and is_nonzero() call) and the copies
// from one device to another (copy_, which to() and _to_copy end in). Not
// those inside ATen's fused optimizer ops: their CPU kernels read each step
// count of a CPU tensor with item() (free there), where their CUDA kernels
// read it on the device.
class HostSyncs {
 public:
  HostSyncs() {
    count_ = 0;
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(
            [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
              const std::string name = fn.name();
              if (fused(name)) {
                ++inside_;
              } else if (inside_ == 0 &&
                         (name == "aten::_local_scalar_dense" || cross_device_copy(fn))) {
                ++count_;
              }
              return nullptr;
            },
            [](const at::RecordFunction& fn, at::ObserverContext* /*context*/) {
              if (fused(fn.name())) {
                --inside_;
              }
            })
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION}));
  }
  ~HostSyncs() { at::removeCallback(handle_); }
  HostSyncs(const HostSyncs&) = delete;
  HostSyncs& operator=(const HostSyncs&) = delete;
  int count() const { return count_.load(); }

 private:
  static bool cross_device_copy(const at::RecordFunction& fn) {
    if (std::string(fn.name()) != "aten::copy_" || fn.inputs().size() < 2) {
      return false;
    }
    const c10::IValue& dst = fn.inputs()[0];
    const c10::IValue& src = fn.inputs()[1];
    return dst.isTensor() && src.isTensor() && dst.toTensor().device() != src.toTensor().device();
  }
  static bool fused(const std::string& name) {
    return name == "aten::_fused_adam_" || name == "aten::_fused_adamw_" ||
           name == "aten::_fused_sgd_";
  }
  static std::atomic<int> count_;
  static thread_local int inside_;
  at::CallbackHandle handle_;
};
std::atomic<int> HostSyncs::count_{0};
thread_local int HostSyncs::inside_ = 0;

// The host reads and cross-device copies `body` makes (counted only where
// `count`, else 0).
template <class Body>
int reads_in(bool count, Body&& body) {
  std::optional<HostSyncs> reads;
  if (count) {
    reads.emplace();
  }
  body();
  return reads ? reads->count() : 0;
}

// The counter itself: a read back to the host and a copy from one device to
// another (CPU to meta, the second device every build has) count one each;
// a copy on one device and a clone on another, none.
TEST(DeviceState, TheSyncCounterSeesReadsAndCrossDeviceCopies) {
  const at::Tensor t = torch::ones({3});
  at::Tensor meta = at::empty({3}, at::TensorOptions().device(at::kMeta));
  HostSyncs syncs;
  torch::zeros({3}).copy_(t);
  meta.clone();
  EXPECT_EQ(syncs.count(), 0);
  meta.copy_(t);
  EXPECT_EQ(syncs.count(), 1);
  EXPECT_EQ(t.sum().item<float>(), 3.0f);
  EXPECT_EQ(syncs.count(), 2);
}

std::vector<at::Tensor> make_params(at::ScalarType dtype = at::kFloat) {
  torch::manual_seed(3);
  std::vector<at::Tensor> ps;
  for (int64_t n : {1, 17, 300}) {
    ps.push_back(torch::randn({n}).to(dtype));
  }
  ps.push_back(torch::randn({12, 10}).to(dtype));
  return ps;
}

template <class Opt>
auto key_of(const Opt& opt, const at::Tensor& p) {
  return torchamp::compat::optim_state_key(opt.state(), p);
}

at::Tensor bits(const at::Tensor& t) {
  return t.contiguous().view(t.element_size() == 2 ? at::kShort : at::kInt);
}

// One scaler and optimizer over its own copy of the parameters.
template <class Opt>
struct Training {
  std::vector<at::Tensor> params;
  Opt opt;
  GradScaler scaler;
  template <class Options>
  Training(const Options& options, FusedOptions fused, GradScalerOptions scaler_options,
           at::ScalarType dtype = at::kFloat)
      : params(make_params(dtype)), opt(params, options, fused), scaler(scaler_options) {}
};

// The host scaler against the device scaler, both over ATen's path (which
// keeps the device scaler's flag on the device: no read), for 200
// iterations with overflows, clipping every third and unscale_ every fifth:
// the same skips, scale, trackers, parameters and step counts. bfloat16
// parameters train with master weights (ATen's path: float32 masters
// updated by ATen's fused ops). The device scaler's iterations read nothing
// back after the first (whose SGD momentum buffers read the flag once) but
// clip_grad_norm_'s norm, counted.
template <class Opt, class Options>
void device_equals_host(const Options& options, GradScalerOptions scaler_options, const char* what,
                        at::ScalarType dtype = at::kFloat) {
  SCOPED_TRACE(what);
  const auto fused = FusedOptions().aten_kernels(true).master_weights(dtype != at::kFloat);
  Training<Opt> host(options, fused, scaler_options, dtype);
  Training<Opt> dev(options, fused, scaler_options.device_state(true), dtype);
  int skipped = 0, reads = 0, expected_reads = 0;
  for (int s = 0; s < 200; ++s) {
    torch::manual_seed(500 + s);
    const bool overflow = s % 11 == 4 || s % 37 == 5;
    for (size_t i = 0; i < host.params.size(); ++i) {
      at::Tensor g =
          (torch::randn(host.params[i].sizes()) * host.scaler.get_scale() * 1e-2).to(dtype);
      if (overflow && i == 1) {
        g[2] = s % 2 ? std::numeric_limits<float>::infinity()
                     : std::numeric_limits<float>::quiet_NaN();
      }
      host.params[i].mutable_grad() = g;
      dev.params[i].mutable_grad() = g.clone();
    }
    // The host scaler's iteration, then the device scaler's, whose host
    // reads are counted from the second iteration on.
    double a = 0, b = 0;
    if (s % 3 == 1) {
      a = host.scaler.clip_grad_norm_(host.opt, 0.3);
    } else if (s % 5 == 2) {
      host.scaler.unscale_(host.opt);
    }
    const bool stepped = host.scaler.step(host.opt).has_value();
    host.scaler.update();
    at::Tensor b_tensor;
    torchamp::StepResult dev_result;
    reads += reads_in(s > 0, [&] {
      if (s % 3 == 1) {
        // Every other clip through the tensor form: the same norm, as a tensor.
        if (s % 2) {
          b = dev.scaler.clip_grad_norm_(dev.opt, 0.3);  // returns a double: one read
          expected_reads += s > 0 ? 1 : 0;
        } else {
          b_tensor = dev.scaler.clip_grad_norm_tensor_(dev.opt, 0.3);
        }
      } else if (s % 5 == 2) {
        dev.scaler.unscale_(dev.opt);
      }
      dev_result = dev.scaler.step(dev.opt);
      dev.scaler.update();
    });
    if (b_tensor.defined()) {
      b = b_tensor.template item<double>();
    }
    ASSERT_TRUE(a == b || (std::isnan(a) && std::isnan(b)))
        << "step " << s << ": " << a << " vs " << b;
    ASSERT_EQ(stepped, dev_result.has_value()) << "step " << s;
    ASSERT_EQ(stepped, !overflow) << "step " << s;
    skipped += stepped ? 0 : 1;
    ASSERT_EQ(host.scaler.get_scale(), dev.scaler.get_scale()) << "step " << s;
    ASSERT_EQ(host.scaler.get_growth_tracker(), dev.scaler.get_growth_tracker()) << "step " << s;
    ASSERT_EQ(host.scaler.get_backoff_tracker(), dev.scaler.get_backoff_tracker()) << "step " << s;
    ASSERT_EQ(host.scaler.get_consecutive_skips(), dev.scaler.get_consecutive_skips())
        << "step " << s;
    for (size_t i = 0; i < host.params.size(); ++i) {
      ASSERT_TRUE(bits(host.params[i]).equal(bits(dev.params[i])))
          << "step " << s << " parameter " << i << " differs by "
          << (host.params[i] - dev.params[i]).abs().max().template item<double>();
      if (dtype != at::kFloat && host.opt.master_weight(host.params[i]).defined()) {
        ASSERT_TRUE(bits(host.opt.master_weight(host.params[i]))
                        .equal(bits(dev.opt.master_weight(dev.params[i]))))
            << "step " << s << " master of parameter " << i;
      }
    }
  }
  EXPECT_GT(skipped, 10);
  EXPECT_EQ(reads, expected_reads) << "host reads in the device scaler's iterations 1-199";
  // The state: moments the same bits, and the step counts the device kept
  // (brought back to the state, as save does).
  dev.opt.fused_step_counts_to_host();
  for (size_t i = 0; i < host.params.size(); ++i) {
    const auto* a = host.opt.state().count(key_of(host.opt, host.params[i]))
                        ? host.opt.state().at(key_of(host.opt, host.params[i])).get()
                        : nullptr;
    const auto* b = dev.opt.state().count(key_of(dev.opt, dev.params[i]))
                        ? dev.opt.state().at(key_of(dev.opt, dev.params[i])).get()
                        : nullptr;
    ASSERT_EQ(a == nullptr, b == nullptr) << "parameter " << i;
    if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(a)) {
      const auto& other = dynamic_cast<const torch::optim::AdamParamState&>(*b);
      EXPECT_EQ(adam->step(), other.step()) << "parameter " << i;
      EXPECT_TRUE(bits(adam->exp_avg_sq()).equal(bits(other.exp_avg_sq()))) << "parameter " << i;
    }
    if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(a)) {
      const auto& other = dynamic_cast<const torch::optim::AdamWParamState&>(*b);
      EXPECT_EQ(adamw->step(), other.step()) << "parameter " << i;
      EXPECT_GT(adamw->step(), 150);
      EXPECT_TRUE(bits(adamw->exp_avg()).equal(bits(other.exp_avg()))) << "parameter " << i;
    }
  }
  EXPECT_EQ(host.scaler.state_dict(), dev.scaler.state_dict());
}

#define SKIP_WITHOUT_ATEN_FUSED_OPS()                                                 \
  if (!torchamp::compat::kAtenFusedOptimizers) {                                      \
    GTEST_SKIP() << "ATen's fused optimizer ops need LibTorch 2.4 or later; this is " \
                 << TORCH_VERSION;                                                    \
  }

TEST(DeviceState, EqualsTheHostScalerStepForStep) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  const auto pytorch = GradScalerOptions().init_scale(1024).growth_interval(10);
  // Paddle's rule: backoff after two overflows in a row, and a floor.
  const auto paddle = GradScalerOptions().init_scale(1024).growth_interval(10).backoff_interval(2);
  const auto floor = GradScalerOptions().init_scale(8).growth_interval(50).min_scale(2);
  device_equals_host<torchamp::optim::AdamW>(torch::optim::AdamWOptions(1e-3).weight_decay(0.1),
                                             pytorch, "AdamW, PyTorch's rule");
  device_equals_host<torchamp::optim::AdamW>(torch::optim::AdamWOptions(1e-3), paddle,
                                             "AdamW, Paddle's rule");
  device_equals_host<torchamp::optim::Adam>(torch::optim::AdamOptions(1e-3).amsgrad(true), floor,
                                            "Adam amsgrad, min_scale");
  device_equals_host<torchamp::optim::SGD>(
      torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true), pytorch, "SGD nesterov");
  device_equals_host<torchamp::optim::SGD>(torch::optim::SGDOptions(1e-2), paddle,
                                           "SGD, Paddle's rule");
  // bfloat16 parameters with float32 master weights on ATen's path.
  device_equals_host<torchamp::optim::AdamW>(torch::optim::AdamWOptions(1e-3).weight_decay(0.1),
                                             pytorch, "AdamW, bfloat16 with masters",
                                             at::kBFloat16);
  device_equals_host<torchamp::optim::SGD>(torch::optim::SGDOptions(1e-2).momentum(0.9), paddle,
                                           "SGD momentum, bfloat16 with masters", at::kBFloat16);
}

// Paddle's facade with its state in tensors (the path CUDA gradients take),
// over ATen's path: minimize() reads nothing back (its StepResult reads when
// asked), and its scales, counters, skips and parameters are the host
// facade's step for step, runs of two overflows backing off (Paddle's
// decr_every_n_nan_or_inf = 2) and lone ones not.
TEST(DeviceState, PaddleFacadeEqualsItsHostScheduleStepForStep) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  for (bool adamw : {true, false}) {
    SCOPED_TRACE(adamw ? "AdamW" : "SGD momentum");
    torchamp::paddle::GradScaler host(true, 1024, 2.0, 0.5, 10, 2);
    torchamp::paddle::GradScaler dev(true, 1024, 2.0, 0.5, 10, 2, true, /*device_state=*/true);
    std::vector<at::Tensor> a = make_params(), b = make_params();
    auto make = [adamw](std::vector<at::Tensor>& ps) -> std::unique_ptr<torch::optim::Optimizer> {
      const auto aten = FusedOptions().aten_kernels(true);
      if (adamw) {
        return std::make_unique<torchamp::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-3), aten);
      }
      return std::make_unique<torchamp::optim::SGD>(
          ps, torch::optim::SGDOptions(1e-2).momentum(0.9), aten);
    };
    auto host_opt = make(a);
    auto dev_opt = make(b);
    int reads = 0, skipped = 0, backoffs = 0;
    for (int s = 0; s < 200; ++s) {
      torch::manual_seed(700 + s);
      const bool overflow = s % 13 == 5 || s % 13 == 6 || s % 29 == 3;
      for (size_t i = 0; i < a.size(); ++i) {
        at::Tensor g = torch::randn(a[i].sizes()) * host.get_scale() * 1e-2;
        if (overflow && i == 1) {
          g[0] = std::numeric_limits<float>::infinity();
        }
        a[i].mutable_grad() = g;
        b[i].mutable_grad() = g.clone();
      }
      const double scale_before = host.get_scale();
      if (s % 4 == 2) {
        host.unscale_(*host_opt);
      }
      const bool stepped = host.minimize(*host_opt).has_value();
      torchamp::StepResult result;
      reads += reads_in(s > 0, [&] {  // from the second iteration (SGD's buffers read once)
        if (s % 4 == 2) {
          dev.unscale_(*dev_opt);
        }
        result = dev.minimize(*dev_opt);
      });
      ASSERT_EQ(stepped, result.has_value()) << "step " << s;
      ASSERT_EQ(stepped, !overflow) << "step " << s;
      skipped += stepped ? 0 : 1;
      backoffs += host.get_scale() < scale_before ? 1 : 0;
      ASSERT_EQ(host.get_scale(), dev.get_scale()) << "step " << s;
      ASSERT_EQ(host.get_incr_count(), dev.get_incr_count()) << "step " << s;
      ASSERT_EQ(host.get_decr_count(), dev.get_decr_count()) << "step " << s;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(bits(a[i]).equal(bits(b[i]))) << "step " << s << " parameter " << i;
      }
    }
    EXPECT_EQ(reads, 0) << "host reads in the device facade's iterations 1-199";
    EXPECT_GT(skipped, 30);
    EXPECT_GE(backoffs, 10);  // the runs of two, not the lone overflows
    EXPECT_LT(backoffs, skipped);
    EXPECT_EQ(host.state_dict(), dev.state_dict());
  }
}

// An optimizer that does not take the scale: Python's _maybe_opt_step reads
// the flag, and so does this one; the schedule is the host's all the same.
TEST(DeviceState, PlainOptimizerStepsAsWithTheHostScaler) {
  const auto options = GradScalerOptions().init_scale(256).growth_interval(3);
  std::vector<at::Tensor> a = make_params(), b = make_params();
  torch::optim::SGD host_opt(a, torch::optim::SGDOptions(0.1).momentum(0.5));
  torch::optim::SGD dev_opt(b, torch::optim::SGDOptions(0.1).momentum(0.5));
  GradScaler host(options), dev(GradScalerOptions(options).device_state(true));
  for (int s = 0; s < 30; ++s) {
    for (size_t i = 0; i < a.size(); ++i) {
      at::Tensor g = torch::full(a[i].sizes(), s % 7 == 3 ? 1e38f : 0.5f) * host.get_scale();
      a[i].mutable_grad() = g;
      b[i].mutable_grad() = g.clone();
    }
    ASSERT_EQ(host.step(host_opt).has_value(), dev.step(dev_opt).has_value()) << "step " << s;
    host.update();
    dev.update();
    ASSERT_EQ(host.get_scale(), dev.get_scale()) << "step " << s;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(a[i].equal(b[i])) << "step " << s;
    }
  }
}

// Inside an iteration (forward, scale, backward, unscale_, step, update) a
// device scaler with a fused optimizer on ATen's path reads nothing back;
// clip_grad_norm_ reads its return value (one); what the program asks for
// afterwards reads then.
TEST(DeviceState, AnIterationReadsNothingBackToTheHost) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  torch::manual_seed(0);
  torch::nn::Linear model(8, 4);
  for (bool sgd : {false, true}) {
    SCOPED_TRACE(sgd ? "SGD" : "AdamW");
    std::unique_ptr<torch::optim::Optimizer> opt;
    const auto aten = FusedOptions().aten_kernels(true);
    if (sgd) {
      opt = std::make_unique<torchamp::optim::SGD>(
          model->parameters(), torch::optim::SGDOptions(1e-2).momentum(0.9), aten);
    } else {
      opt = std::make_unique<torchamp::optim::AdamW>(model->parameters(),
                                                     torch::optim::AdamWOptions(1e-3), aten);
    }
    GradScaler scaler(
        GradScalerOptions().init_scale(1 << 20).growth_interval(2).device_state(true));
    const at::Tensor x = torch::randn({16, 8});
    const at::Tensor y = torch::randn({16, 4});
    auto iteration = [&](int s, bool clip, bool clip_tensor = false) {
      opt->zero_grad();
      at::Tensor loss = torch::mse_loss(model->forward(x), y);
      if (s % 4 == 3) {
        loss = loss * std::numeric_limits<float>::infinity();  // an overflow from the data
      }
      scaler.scale(loss).backward();
      if (clip_tensor) {
        scaler.clip_grad_norm_tensor_(*opt, 1.0);
      } else if (clip) {
        scaler.clip_grad_norm_(*opt, 1.0);
      } else if (s % 2 == 0) {
        scaler.unscale_(*opt);
      }
      scaler.step(*opt);
      scaler.update();
    };
    iteration(0, false);  // SGD's first step makes its momentum buffers: it reads the flag once
    {
      HostSyncs reads;
      for (int s = 1; s < 12; ++s) {
        iteration(s, false);
      }
      EXPECT_EQ(reads.count(), 0) << "host reads in 11 iterations";
    }
    {
      HostSyncs reads;
      iteration(13, true);
      EXPECT_EQ(reads.count(), 1) << "clip_grad_norm_ returns the norm: one read";
    }
    {
      HostSyncs reads;
      iteration(14, false, true);
      iteration(15, false, true);  // an overflow
      EXPECT_EQ(reads.count(), 0) << "clip_grad_norm_tensor_ keeps the norm on the device";
    }
    {
      HostSyncs reads;
      opt->zero_grad();
      scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
      torchamp::StepResult result = scaler.step(*opt);
      scaler.update();
      EXPECT_EQ(reads.count(), 0);
      EXPECT_TRUE(result.has_value());
      EXPECT_TRUE(static_cast<bool>(result));  // read once, then remembered
      EXPECT_EQ(reads.count(), 1);
      const double scale = scaler.get_scale();
      EXPECT_GT(scale, 0);
      EXPECT_GE(reads.count(), 2);
    }
  }
}

using torchamp_test::TopLevelOps;

// A device scaler's norm for the folded clip takes the gradients' float64
// norms in one multi-tensor op (ATen's _foreach_norm, where it takes a
// dtype; else a norm each), not a cast, a square, a sum and an add a
// gradient; disabled, its clip is Python's foreach one (_foreach_norm and
// _foreach_mul_), not a norm, a copy and a multiply a gradient. On a GPU
// each of those is a kernel launch.
TEST(DeviceState, TheClipsNormIsNotOperatorsAGradient) {
  for (const bool enabled : {true, false}) {
    SCOPED_TRACE(enabled ? "enabled" : "disabled");
    auto ops_for = [enabled](int n) {
      std::vector<at::Tensor> params;
      for (int i = 0; i < n; ++i) {
        params.push_back(torch::ones({3, 5}).requires_grad_());
      }
      torchamp::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
      GradScaler scaler(GradScalerOptions().init_scale(4).enabled(enabled).device_state(true));
      scaler.scale(torch::zeros({})).item<float>();  // the state made before counting
      const double scale = enabled ? 4.0 : 1.0;
      double want = 0;
      for (int i = 0; i < n; ++i) {
        params[i].mutable_grad() = torch::full({3, 5}, scale * (i + 1));
        want += 15.0 * (i + 1) * (i + 1);
      }
      TopLevelOps ops;
      const at::Tensor norm = scaler.clip_grad_norm_tensor_(opt, 1e6);  // no clip: the same bits
      const int count = ops.count();
      EXPECT_FLOAT_EQ(norm.item<float>(), static_cast<float>(std::sqrt(want))) << n;
      return count;
    };
    const int few = ops_for(4), many = ops_for(40);
    // None more where ATen has both multi-tensor ops (LibTorch 2.1 on); one
    // a gradient where a fallback takes each (1.13).
    const int bound = torchamp::compat::ForeachNormTakesDtype<at::TensorList>::value &&
                              torchamp::compat::ForeachMulTakesTensor<at::TensorList>::value
                          ? 0
                          : 36;
    EXPECT_LE(many - few, bound) << "operators for 4 gradients: " << few << ", for 40: " << many;
  }
}

// Disabled (bfloat16 training needs no scale) with device_state, the clip
// of CPU gradients takes the path CUDA ones take: Python's clip_grad_norm_
// in tensor ops, no read back; its norm and gradients are the host clip's
// (a float64 sum there: within float32 rounding).
TEST(DeviceState, ADisabledScalerClipsInTensorOpsWithNoRead) {
  for (const double max_norm : {0.05, 100.0}) {  // clipped, and not
    SCOPED_TRACE(max_norm);
    torch::manual_seed(0);
    torch::nn::Linear model(8, 4);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
    auto grads = [&] {
      opt.zero_grad();
      torch::mse_loss(model->forward(torch::ones({3, 8})), torch::zeros({3, 4})).backward();
    };
    GradScaler host(GradScalerOptions().enabled(false));
    GradScaler device(GradScalerOptions().enabled(false).device_state(true));
    grads();
    const at::Tensor host_norm = host.clip_grad_norm_tensor_(opt, max_norm);
    std::vector<at::Tensor> host_grads;
    for (const auto& p : model->parameters()) {
      host_grads.push_back(p.grad().clone());
    }
    grads();
    at::Tensor norm;
    {
      HostSyncs reads;
      norm = device.clip_grad_norm_tensor_(opt, max_norm);
      EXPECT_EQ(reads.count(), 0) << "the norm and the clip stay in tensors";
    }
    EXPECT_EQ(norm.scalar_type(), at::kFloat);
    EXPECT_TRUE(torch::allclose(norm, host_norm, 1e-6, 0));
    for (size_t i = 0; i < host_grads.size(); ++i) {
      EXPECT_TRUE(torch::allclose(model->parameters()[i].grad(), host_grads[i], 1e-6, 0)) << i;
    }
  }
}

// A device scaler with an optimizer that takes no scale (LibTorch's SGD):
// clip_grad_norm_tensor_ is unscale_ then Python's tensor-op clip, with no
// read back (it read each gradient's sum of squares, which a CUDA graph
// capture cannot do); its norm and gradients are the host scaler's to
// float32 rounding, and an overflow still skips the step (which reads the
// flag: such an optimizer steps on the host's decision).
TEST(DeviceState, AnOptimizerThatTakesNoScaleClipsWithNoRead) {
  for (const double max_norm : {0.05, 100.0}) {  // clipped, and not
    SCOPED_TRACE(max_norm);
    torch::manual_seed(0);
    torch::nn::Linear a(8, 4), b(8, 4);
    b->weight.data().copy_(a->weight.data());
    b->bias.data().copy_(a->bias.data());
    torch::optim::SGD host_opt(a->parameters(), torch::optim::SGDOptions(0.1));
    torch::optim::SGD dev_opt(b->parameters(), torch::optim::SGDOptions(0.1));
    const auto options = GradScalerOptions().init_scale(1024);
    GradScaler host(options), dev(GradScalerOptions(options).device_state(true));
    for (int s = 0; s < 3; ++s) {
      const float scale = s == 1 ? std::numeric_limits<float>::infinity() : 1.0f;  // overflow
      auto backward = [&](torch::nn::Linear& m, torch::optim::SGD& opt, GradScaler& scaler) {
        opt.zero_grad();
        scaler.scale(torch::mse_loss(m->forward(torch::ones({3, 8})), torch::zeros({3, 4})) * scale)
            .backward();
      };
      backward(a, host_opt, host);
      const at::Tensor host_norm = host.clip_grad_norm_tensor_(host_opt, max_norm);
      backward(b, dev_opt, dev);
      at::Tensor norm;
      {
        HostSyncs reads;
        norm = dev.clip_grad_norm_tensor_(dev_opt, max_norm);
        // Below LibTorch 2.3 unscale_ runs torchamp's registration of ATen's
        // CPU AMP op, which reads its CPU inverse scale (no sync on a CPU).
        EXPECT_EQ(reads.count(), torchamp::compat::kAtenHasCpuAmpKernels ? 0 : 1)
            << "step " << s << ": unscale_ and the clip stay in tensors";
      }
      if (s == 1) {
        EXPECT_FALSE(std::isfinite(norm.item<float>()));
      } else {
        EXPECT_TRUE(torch::allclose(norm, host_norm, 1e-6, 0)) << "step " << s;
        for (size_t i = 0; i < 2; ++i) {
          EXPECT_TRUE(
              torch::allclose(b->parameters()[i].grad(), a->parameters()[i].grad(), 1e-6, 0))
              << "step " << s << " gradient " << i;
        }
      }
      ASSERT_EQ(host.step(host_opt).has_value(), s != 1);
      ASSERT_EQ(dev.step(dev_opt).has_value(), s != 1);
      host.update();
      dev.update();
      ASSERT_EQ(host.get_scale(), dev.get_scale()) << "step " << s;
      for (size_t i = 0; i < 2; ++i) {
        EXPECT_TRUE(torch::allclose(b->parameters()[i], a->parameters()[i], 1e-6, 0))
            << "step " << s << " parameter " << i;
      }
    }
  }
}

// The disabled tensor-op clip on what the host clip also takes: no gradient
// (a 0 norm, nothing thrown) and a sparse gradient with a repeated index
// (coalesced first: its norm is the host clip's).
TEST(DeviceState, ADisabledScalerClipsNoGradientAndSparseOnesAsTheHostClip) {
  const at::Tensor p = torch::zeros({4, 3}).requires_grad_();
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  GradScaler host(GradScalerOptions().enabled(false));
  GradScaler device(GradScalerOptions().enabled(false).device_state(true));
  EXPECT_EQ(device.clip_grad_norm_tensor_(opt, 1.0).item<float>(), 0.0f);
  EXPECT_EQ(host.clip_grad_norm_tensor_(opt, 1.0).item<float>(), 0.0f);
  auto sparse = [] {  // row 1 twice: its values add up when coalesced
    const at::Tensor indices = torch::tensor({1, 1, 3}, torch::kLong).unsqueeze(0);
    return torch::sparse_coo_tensor(indices, torch::ones({3, 3}) * 2, {4, 3});
  };
  p.mutable_grad() = sparse();
  const float want = host.clip_grad_norm_tensor_(opt, 100.0).item<float>();
  EXPECT_FLOAT_EQ(want, std::sqrt(3.0f * 16 + 3.0f * 4));
  p.mutable_grad() = sparse();
  EXPECT_FLOAT_EQ(device.clip_grad_norm_tensor_(opt, 100.0).item<float>(), want);
}

// What the program asks of a device scaler it reads back; a setter or a
// load writes the device state, and the schedule goes on from there.
TEST(DeviceState, SettersAndLoadsWriteTheDeviceState) {
  GradScaler host(GradScalerOptions().init_scale(64).growth_interval(2));
  GradScaler dev(GradScalerOptions().init_scale(64).growth_interval(2).device_state(true));
  auto p = torch::zeros({3});
  auto q = torch::zeros({3});
  torch::optim::SGD host_opt({p}, torch::optim::SGDOptions(0.1));
  torch::optim::SGD dev_opt({q}, torch::optim::SGDOptions(0.1));
  auto step = [&](bool overflow) {
    p.mutable_grad() = torch::full({3}, overflow ? INFINITY : 1.0f);
    q.mutable_grad() = p.grad().clone();
    host.step(host_opt);
    dev.step(dev_opt);
    host.update();
    dev.update();
  };
  step(false);
  host.set_init_scale(512);
  dev.set_init_scale(512);
  step(false);
  EXPECT_EQ(dev.get_scale(), host.get_scale());
  host.set_growth_interval(1);  // below the tracker: the next clean update grows
  dev.set_growth_interval(1);
  step(false);
  EXPECT_EQ(dev.get_scale(), host.get_scale());
  EXPECT_EQ(dev.get_growth_tracker(), host.get_growth_tracker());
  GradScaler loaded(GradScalerOptions().device_state(true));
  loaded.load_state_dict(host.state_dict());
  step(true);
  EXPECT_EQ(dev.state_dict(), host.state_dict());
  GradScaler copy = dev;  // its own state tensors
  copy.update(8.0);
  EXPECT_EQ(copy.get_scale(), 8.0);
  dev.update(4096.0);
  EXPECT_EQ(dev.get_scale(), 4096.0);
  EXPECT_EQ(copy.get_scale(), 8.0);
  EXPECT_EQ(loaded.get_scale(), 2048.0);  // as loaded, before the overflow
}

// A flag or scale of the wrong kind from a user's own code calling amp_step:
// a typed error naming it, and nothing changed.
TEST(DeviceState, BadDeviceArgumentsAreTypedErrorsThatChangeNothing) {
  for (bool aten : {false, true}) {
    if (aten && !torchamp::compat::kAtenFusedOptimizers) {
      continue;
    }
    auto p = torch::ones({4});
    torchamp::optim::AdamW opt({p}, torch::optim::AdamWOptions(0.1),
                               FusedOptions().aten_kernels(aten));
    p.mutable_grad() = torch::ones({4});
    const at::Tensor before = p.clone();
    torchamp::AmpStepArgs wrong_dtype;
    wrong_dtype.found_inf_tensor = torch::zeros({}, at::kDouble);
    torchamp_test::expect_throws<c10::ValueError>(
        [&] { opt.amp_step(wrong_dtype); }, "AmpStepArgs::found_inf_tensor must be a float32");
    torchamp::AmpStepArgs wrong_size;
    wrong_size.found_inf_tensor = torch::zeros({});
    wrong_size.grad_scale_tensor = torch::ones({2});
    torchamp_test::expect_throws<c10::ValueError>([&] { opt.amp_step(wrong_size); },
                                                  "grad_scale_tensor must be a float32 tensor of "
                                                  "one element");
    torchamp::AmpStepArgs scale_alone;
    scale_alone.grad_scale_tensor = torch::ones({});
    torchamp_test::expect_throws<c10::ValueError>([&] { opt.amp_step(scale_alone); },
                                                  "grad_scale_tensor without found_inf_tensor");
    torchamp::AmpStepArgs elsewhere;  // on a device none of the parameters lives on
    elsewhere.found_inf_tensor = torch::zeros({}, at::TensorOptions().device(at::kMeta));
    torchamp_test::expect_throws<c10::ValueError>(
        [&] { opt.amp_step(elsewhere); },
        "AmpStepArgs::found_inf_tensor lives on meta, where none of the optimizer's parameters");
    elsewhere.found_inf_tensor = torch::zeros({});
    elsewhere.grad_scale_tensor = torch::ones({}, at::TensorOptions().device(at::kMeta));
    torchamp_test::expect_throws<c10::ValueError>([&] { opt.amp_step(elsewhere); },
                                                  "AmpStepArgs::grad_scale_tensor lives on meta");
    EXPECT_TRUE(p.equal(before));
    EXPECT_TRUE(opt.state().empty());
    torchamp::AmpStepArgs good;  // and then a good one steps
    good.found_inf_tensor = torch::zeros({});
    opt.amp_step(good);
    EXPECT_FALSE(p.equal(before));
  }
}

// A user's optimizer written against the hook before it took tensors
// (takes_device_args() false): under a device scaler it gets the flag and
// the scale as host values (the scaler reads them back, one read a step)
// and steps as under the host scaler.
class OldHookSGD : public torch::optim::SGD, public torchamp::StepSupportsAmpScaling {
 public:
  using torch::optim::SGD::SGD;
  bool supports_amp_scaling() const override { return true; }
  void amp_step(const torchamp::AmpStepArgs& args) override {
    EXPECT_FALSE(args.found_inf_tensor.defined());
    EXPECT_FALSE(args.grad_scale_tensor.defined());
    calls.push_back(args.found_inf);
    if (args.found_inf) {
      return;
    }
    if (args.grad_scale) {
      at::NoGradGuard no_grad;
      for (auto& p : param_groups()[0].params()) {
        p.mutable_grad().div_(*args.grad_scale);
      }
    }
    step();
  }
  std::vector<bool> calls;
};

TEST(DeviceState, AnOptimizerOnTheOldHookStepsAsUnderTheHostScaler) {
  const auto options = GradScalerOptions().init_scale(512).growth_interval(3);
  std::vector<at::Tensor> a = make_params(), b = make_params();
  OldHookSGD host_opt(a, torch::optim::SGDOptions(0.05).momentum(0.9));
  OldHookSGD dev_opt(b, torch::optim::SGDOptions(0.05).momentum(0.9));
  GradScaler host(options), dev(GradScalerOptions(options).device_state(true));
  for (int s = 0; s < 40; ++s) {
    torch::manual_seed(900 + s);
    for (size_t i = 0; i < a.size(); ++i) {
      at::Tensor g = torch::randn(a[i].sizes()) * host.get_scale();
      if (s % 6 == 4 && i == 2) {
        g[1] = std::numeric_limits<float>::infinity();
      }
      a[i].mutable_grad() = g;
      b[i].mutable_grad() = g.clone();
    }
    if (s % 4 == 1) {  // then no scale is passed: the gradients are real already
      host.unscale_(host_opt);
      dev.unscale_(dev_opt);
    }
    ASSERT_EQ(host.step(host_opt).has_value(), dev.step(dev_opt).has_value()) << "step " << s;
    host.update();
    dev.update();
    ASSERT_EQ(host.get_scale(), dev.get_scale()) << "step " << s;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(bits(a[i]).equal(bits(b[i]))) << "step " << s << " parameter " << i;
    }
  }
  EXPECT_EQ(host_opt.calls, dev_opt.calls);
  EXPECT_EQ(std::count(dev_opt.calls.begin(), dev_opt.calls.end(), true), 6);  // s % 6 == 4
}

// A device scaler finds the non-finite gradients when asked.
TEST(DeviceState, NonFiniteGradientsAreFoundWhenAsked) {
  GradScaler scaler(GradScalerOptions().device_state(true));
  auto a = torch::zeros({2});
  auto b = torch::zeros({2});
  scaler.register_parameter_name("b", b);
  torch::optim::SGD opt({a, b}, torch::optim::SGDOptions(0.1));
  a.mutable_grad() = torch::ones({2});
  b.mutable_grad() = torch::tensor({1.0f, NAN});
  scaler.unscale_(opt);
  const auto report = scaler.non_finite_gradients(opt);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].index, 1u);
  EXPECT_EQ(report[0].name, "b");
  EXPECT_FALSE(scaler.step(opt).has_value());
}

}  // namespace

namespace {

// Two AdamW steps with the rate changed between them: through lr_tensor
// (filled) in one optimizer, through options().lr() in the other; the same
// bits, on ATen's path and on torchamp's CPU kernels.
TEST(DeviceState, ALearningRateTensorStepsAsTheOptionsRate) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  for (bool aten : {true, false}) {
    SCOPED_TRACE(aten ? "ATen's path" : "CPU kernels");
    const auto fused = FusedOptions().aten_kernels(aten);
    Training<torchamp::optim::AdamW> a(torch::optim::AdamWOptions(0.5), fused, GradScalerOptions());
    Training<torchamp::optim::AdamW> b(torch::optim::AdamWOptions(0.5), fused, GradScalerOptions());
    at::Tensor lr = b.opt.lr_tensor(0);
    EXPECT_EQ(lr.scalar_type(), at::kFloat);
    EXPECT_EQ(lr.item<double>(), 0.5);
    EXPECT_TRUE(lr.is_same(b.opt.lr_tensor(0)));  // the same tensor every call
    for (double rate : {0.5, 0.0078125}) {        // powers of two: exact in float32
      static_cast<torch::optim::AdamWOptions&>(a.opt.param_groups()[0].options()).lr(rate);
      lr.fill_(rate);
      for (size_t i = 0; i < a.params.size(); ++i) {
        a.params[i].mutable_grad() = torch::randn(a.params[i].sizes());
        b.params[i].mutable_grad() = a.params[i].grad().clone();
      }
      a.opt.step();
      b.opt.step();
    }
    for (size_t i = 0; i < a.params.size(); ++i) {
      EXPECT_TRUE(bits(a.params[i]).equal(bits(b.params[i]))) << "parameter " << i;
    }
    // A save writes the tensor's rate; a load writes the loaded one into it.
    std::stringstream saved;
    {
      torch::serialize::OutputArchive archive;
      b.opt.save(archive);
      archive.save_to(saved);
    }
    lr.fill_(0.25);
    torch::serialize::InputArchive archive;
    archive.load_from(saved);
    b.opt.load(archive);
    EXPECT_EQ(lr.item<double>(), 0.0078125);
    EXPECT_THROW(b.opt.lr_tensor(1), c10::IndexError);
  }
}

}  // namespace

namespace {

// On a GPU (skipped without one): bfloat16 and float16 parameters with
// float32 master weights under a CUDA GradScaler, with overflows from the
// data and a rate in lr_tensor; beside the same run on the CPU through ATen's
// path (aten_kernels, a device_state scaler). The same skips and scales step
// for step; masters within float32 rounding of the CPU's (the two devices'
// AdamW kernels may round differently); every parameter exactly its master
// rounded; and, under c10's sync debug mode, no device-to-host sync in an
// iteration.
// While it lives a device-to-host sync is an error on CUDA (c10's sync debug
// mode); nothing where LibTorch has no CUDA.
struct NoSyncs {
#if TORCHAMP_WITH_CUDA
  NoSyncs() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~NoSyncs() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
#else
  NoSyncs() = default;
#endif
  NoSyncs(const NoSyncs&) = delete;
  NoSyncs& operator=(const NoSyncs&) = delete;
};

// One side of a GPU test: make_params() on `device` in `dtype`, AdamW on
// ATen's path with `fused`, and a scaler with its state in tensors.
struct GpuSide {
  std::vector<at::Tensor> params;
  std::unique_ptr<torchamp::optim::AdamW> opt;
  std::unique_ptr<GradScaler> scaler;
  GpuSide(c10::Device device, at::ScalarType dtype, const torch::optim::AdamWOptions& options,
          const FusedOptions& fused) {
    for (const at::Tensor& p : make_params()) {
      params.push_back(p.to(device, dtype));
    }
    opt = std::make_unique<torchamp::optim::AdamW>(params, options,
                                                   FusedOptions(fused).aten_kernels(true));
    scaler = std::make_unique<GradScaler>(
        GradScalerOptions().init_scale(1 << 12).growth_interval(3).device_state(true));
  }
};

TEST(DeviceStateCuda, MasterWeightsTrainOnTheGpuAsOnTheCpu) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    const auto make = [&](c10::Device device) {
      return GpuSide(device, dtype, torch::optim::AdamWOptions(1e-2),
                     FusedOptions().master_weights(true));
    };
    GpuSide cpu = make(c10::kCPU), gpu = make(c10::kCUDA);
    at::Tensor lr = gpu.opt->lr_tensor(0);
    for (int s = 0; s < 40; ++s) {
      torch::manual_seed(700 + s);
      const double rate = 1e-2 * (1.0 - s / 80.0);
      static_cast<torch::optim::AdamWOptions&>(cpu.opt->param_groups()[0].options()).lr(rate);
      lr.fill_(rate);
      for (size_t i = 0; i < cpu.params.size(); ++i) {
        at::Tensor g = torch::randn(cpu.params[i].sizes()) * 1e-2 * cpu.scaler->get_scale();
        if (s % 7 == 3 && i == 2) {
          g[0] = std::numeric_limits<float>::infinity();
        }
        cpu.params[i].mutable_grad() = g.to(dtype);
        gpu.params[i].mutable_grad() = g.to(dtype).to(c10::kCUDA);
      }
      {
        std::optional<NoSyncs> no_syncs;
        if (s > 0) {  // the first step makes the state; from then on no sync
          no_syncs.emplace();
        }
        gpu.scaler->clip_grad_norm_tensor_(*gpu.opt, 5.0);
        gpu.scaler->step(*gpu.opt);
        gpu.scaler->update();
      }
      cpu.scaler->clip_grad_norm_tensor_(*cpu.opt, 5.0);
      const bool stepped = cpu.scaler->step(*cpu.opt).has_value();
      cpu.scaler->update();
      ASSERT_EQ(stepped, s % 7 != 3) << "step " << s;
      ASSERT_EQ(cpu.scaler->get_scale(), gpu.scaler->get_scale()) << "step " << s;
      for (size_t i = 0; i < cpu.params.size(); ++i) {
        const at::Tensor master = gpu.opt->master_weight(gpu.params[i]);
        ASSERT_TRUE(master.defined());
        EXPECT_TRUE(
            bits(torchamp_test::master_rounded(master, dtype)).equal(bits(gpu.params[i].cpu())))
            << "step " << s << ": parameter " << i << " is not its master rounded";
        EXPECT_TRUE(
            torch::allclose(master.cpu(), cpu.opt->master_weight(cpu.params[i]), 1e-5, 1e-6))
            << "step " << s << ": parameter " << i;
      }
    }
  }
}

// On a GPU (skipped without one): one optimizer over a CPU and a CUDA
// parameter (ATen's path on both), both gradients overflowing. The flags of
// the two devices add up to 2, and ATen's fused kernels skip only at exactly
// 1 (as Python's GradScaler hands them the sum): the step must still be
// skipped on both devices, then train on as a CPU-only run does.
TEST(DeviceStateCuda, OverflowsOnTwoDevicesSkipTheStepOnBoth) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  const std::vector<at::Tensor> start = {torch::randn({8, 4}), torch::randn({16})};
  auto train = [&](c10::Device second) {
    std::vector<at::Tensor> ps = {start[0].clone(), start[1].to(second)};
    torchamp::optim::AdamW opt(ps, torch::optim::AdamWOptions(1e-2),
                               FusedOptions().aten_kernels(true));
    GradScaler scaler(GradScalerOptions().init_scale(1 << 10).device_state(true));
    std::vector<std::vector<at::Tensor>> seen;
    for (int s = 0; s < 4; ++s) {
      torch::manual_seed(900 + s);
      for (size_t i = 0; i < ps.size(); ++i) {
        at::Tensor g = torch::randn(ps[i].sizes()) * 1e-2 * scaler.get_scale();
        if (s == 2) {
          g[0] = std::numeric_limits<float>::infinity();
        }
        ps[i].mutable_grad() = g.to(ps[i].device());
      }
      scaler.step(opt);
      scaler.update();
      seen.push_back({ps[0].clone(), ps[1].cpu()});
    }
    return seen;
  };
  const auto mixed = train(c10::kCUDA), cpu = train(c10::kCPU);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(mixed[2][i].equal(mixed[1][i])) << "parameter " << i << " moved on the overflow";
    EXPECT_TRUE(torch::allclose(mixed[3][i], cpu[3][i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

// On a GPU (skipped without one): bfloat16 parameters with stochastic
// rounding, beside the same run on the CPU through ATen's path, under a
// device scaler (the count on the device) and in plain steps (the count on
// the host, the keys made on the GPU from it): from the second step on no
// device-to-host sync (c10's sync debug mode), and after 20 steps the same
// bits but where the two devices' AdamW kernels round a float32 update
// differently (under 1% of elements, within 2 bfloat16 steps).
TEST(DeviceStateCuda, StochasticRoundingRunsOnTheGpuAsOnTheCpuWithNoSync) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  for (const bool scaled : {true, false}) {
    SCOPED_TRACE(scaled ? "device scaler" : "plain steps");
    const auto make = [&](c10::Device device) {
      return GpuSide(device, at::kBFloat16, torch::optim::AdamWOptions(1e-2).amsgrad(true),
                     FusedOptions().stochastic_rounding(true).seed(5));
    };
    GpuSide cpu = make(c10::kCPU), gpu = make(c10::kCUDA);
    for (int s = 0; s < 20; ++s) {
      torch::manual_seed(900 + s);
      const double scale = scaled ? cpu.scaler->get_scale() : 1.0;
      for (size_t i = 0; i < cpu.params.size(); ++i) {
        at::Tensor g = torch::randn(cpu.params[i].sizes()) * 1e-2 * scale;
        if (scaled && s % 7 == 3 && i == 2) {
          g[0] = std::numeric_limits<float>::infinity();
        }
        cpu.params[i].mutable_grad() = g.to(at::kBFloat16);
        gpu.params[i].mutable_grad() = g.to(at::kBFloat16).to(c10::kCUDA);
      }
      for (GpuSide* side : {&gpu, &cpu}) {
        std::optional<NoSyncs> no_syncs;
        if (side == &gpu && s > 0) {  // the first step makes the state
          no_syncs.emplace();
        }
        if (scaled) {
          side->scaler->step(*side->opt);
          side->scaler->update();
        } else {
          side->opt->step();
        }
      }
    }
    int64_t differ = 0, total = 0, widest = 0;
    for (size_t i = 0; i < cpu.params.size(); ++i) {
      const at::Tensor gap =
          (bits(cpu.params[i]).to(at::kInt) - bits(gpu.params[i].cpu()).to(at::kInt)).abs_();
      differ += gap.ne(0).sum().item<int64_t>();
      total += gap.numel();
      widest = std::max(widest, gap.max().item<int64_t>());
    }
    std::cout << "[ gpu rounding ] " << (scaled ? "device scaler" : "plain steps") << ": " << differ
              << " of " << total << " elements differ from the CPU's, by at most " << widest
              << " bfloat16 steps\n";
    EXPECT_LE(differ * 100, total);
    EXPECT_LE(widest, 2);
  }
}

}  // namespace

#if TORCHAMP_WITH_CUDA
namespace {

// While a CUDA graph is being captured, what would read the flag back at
// every step (here max_consecutive_skips) and a CPU parameter's update are
// refused with errors that say so, before anything changes; the capture
// then ends cleanly.
TEST(DeviceStateCuda, CaptureRefusesWhatItCannotReplay) {
  SKIP_WITHOUT_ATEN_FUSED_OPS();
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "no CUDA device";
  }
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard on_stream(stream);
  auto gpu = torch::ones({8}, torch::kCUDA);
  auto cpu = torch::ones({8});
  torchamp::optim::AdamW opt({gpu, cpu}, torch::optim::AdamWOptions(0.1));
  GradScaler scaler(GradScalerOptions().max_consecutive_skips(3));
  auto backward = [&] {
    opt.zero_grad();
    scaler.scale(gpu.mul(2).sum() + cpu.mul(3).sum().to(torch::kCUDA)).backward();
  };
  gpu.set_requires_grad(true);
  cpu.set_requires_grad(true);
  backward();  // eager: the scaler's state moves to the GPU, the optimizer makes its state
  scaler.step(opt);
  scaler.update();
  backward();
  const at::Tensor gpu_before = gpu.detach().clone(), cpu_before = cpu.detach().clone();
  {
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    torchamp_test::expect_throws<c10::Error>([&] { scaler.step(opt); },
                                             "max_consecutive_skips > 0 reads the found-inf flag");
    graph.capture_end();
  }
  scaler.set_max_consecutive_skips(0);
  {
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    torchamp_test::expect_throws<c10::Error>(
        [&] { opt.step(); }, "param_groups[0].params[1] is a CPU tensor while a CUDA graph");
    graph.capture_end();
  }
  torch::cuda::synchronize();
  EXPECT_TRUE(gpu.detach().equal(gpu_before));
  EXPECT_TRUE(cpu.detach().equal(cpu_before));
  // Stochastic rounding with its update count on the host (a plain step):
  // the count would be frozen into the graph.
  auto bf16 = torch::ones({8}, torch::dtype(torch::kBFloat16).device(torch::kCUDA));
  torchamp::optim::AdamW rounding({bf16}, torch::optim::AdamWOptions(0.1),
                                  torchamp::optim::FusedOptions().stochastic_rounding(true));
  bf16.mutable_grad() = torch::full({8}, 0.5, bf16.options());
  rounding.step();  // eager: the state made
  const at::Tensor bf16_before = bf16.detach().clone();
  {
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    torchamp_test::expect_throws<c10::Error>(
        [&] { rounding.step(); }, "stochastic rounding while a CUDA graph is being captured");
    graph.capture_end();
  }
  torch::cuda::synchronize();
  EXPECT_TRUE(bf16.detach().equal(bf16_before));
  const auto key = torchamp::compat::optim_state_key(rounding.state(), bf16);
  EXPECT_EQ(static_cast<const torch::optim::AdamWParamState&>(*rounding.state().at(key)).step(), 1);
  // State a step would make (its fill would run again at every replay): no
  // eager step first, or none since load().
  auto refused = [&](torch::optim::Optimizer& o, const at::Tensor& p, const std::string& what) {
    const at::Tensor before = p.detach().clone();
    const size_t states = o.state().size();
    {
      at::cuda::CUDAGraph graph;
      graph.capture_begin();
      torchamp_test::expect_throws<c10::Error>(
          [&] { o.step(); },
          "param_groups[0].params[0] would get " + what + " while a CUDA graph is being captured");
      graph.capture_end();
    }
    torch::cuda::synchronize();
    EXPECT_TRUE(p.detach().equal(before)) << what;
    EXPECT_EQ(o.state().size(), states) << what;
  };
  auto param = [](at::ScalarType dtype) {
    auto p = torch::ones({8}, torch::dtype(dtype).device(torch::kCUDA));
    p.mutable_grad() = torch::full({8}, 0.5, p.options());
    return p;
  };
  const at::Tensor a = param(at::kFloat), m = param(at::kBFloat16), s = param(at::kFloat);
  torchamp::optim::AdamW fresh({a}, torch::optim::AdamWOptions(0.1));
  refused(fresh, a, "its Adam state");
  torchamp::optim::AdamW masters({m}, torch::optim::AdamWOptions(0.1),
                                 torchamp::optim::FusedOptions().master_weights(true));
  refused(masters, m, "its master weight");
  torchamp::optim::SGD momentum({s}, torch::optim::SGDOptions(0.1).momentum(0.9));
  refused(momentum, s, "its momentum buffer");
  fresh.step();  // eager: the state made
  std::stringstream saved;
  torch::save(fresh, saved);
  torch::load(fresh, saved);
  refused(fresh, a, "its step count on the device");
}

}  // namespace
#endif
