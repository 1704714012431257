// Every bad input of docs/errors.md, one case per row: the exception type, a
// message that names the culprit, and nothing changed. ErrorsTable.DocMatches
// keeps docs/errors.md and this table identical.
#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>
#include <torchamp/config.h>
#include <torchamp/grad_scaler.h>
#include <torchamp/paddle.h>
#if TORCHAMP_WITH_DISTRIBUTED
#include <torchamp/distributed.h>
#endif

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <string>

const char* torchamp_test_source_dir();  // source_dir.cpp

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;
using torchamp::StateDict;
namespace paddle = torchamp::paddle;

enum class Err { kRuntime, kValue, kNotImplemented, kType };

// Two scalers with non-default values and some history, an optimizer with two
// parameters holding gradients.
struct Fixture {
  torch::Tensor a = torch::zeros({3}, torch::requires_grad());
  torch::Tensor b = torch::zeros({3}, torch::requires_grad());
  std::unique_ptr<torch::optim::SGD> opt;
  GradScaler core{GradScalerOptions()
                      .init_scale(512)
                      .growth_interval(7)
                      .backoff_interval(2)
                      .min_scale(1)
                      .max_consecutive_skips(5)};
  paddle::GradScaler paddle{true, 1024, 2.0, 0.5, 9, 3};

  Fixture() {
    opt = std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{a, b}, 0.1);
    for (int i = 0; i < 2; ++i) {  // some history: trackers are not zero
      set_grads();
      core.step(*opt);
      core.update();
      set_grads();
      paddle.minimize(*opt);
    }
    set_grads();
  }
  void set_grads() {
    a.mutable_grad() = torch::full({3}, 512.0f);
    b.mutable_grad() = torch::full({3}, -1024.0f);
  }
  void clear_grads() {
    a.mutable_grad() = torch::Tensor();
    b.mutable_grad() = torch::Tensor();
  }
  StateDict core_dict() const { return core.state_dict(); }
  StateDict paddle_dict() const { return paddle.state_dict(); }
};

StateDict empty_dict() {
  return StateDict(c10::StringType::get(), c10::AnyType::get());
}
StateDict with(StateDict d, const char* key, c10::IValue v) {
  d = d.copy();
  d.insert_or_assign(key, std::move(v));
  return d;
}
StateDict without(StateDict d, const char* key) {
  d = d.copy();
  EXPECT_EQ(d.erase(key), 1u) << key;
  return d;
}

// Everything the fixture holds, as bytes and tensors.
struct Snapshot {
  std::vector<char> core, paddle;
  double core_scale, paddle_scale;
  std::vector<torch::Tensor> tensors;
  explicit Snapshot(const Fixture& f)
      : core(torch::pickle_save(f.core.state_dict())),
        paddle(torch::pickle_save(f.paddle.state_dict())),
        core_scale(f.core.get_scale()),
        paddle_scale(f.paddle.get_scale()) {
    for (const auto& t : {f.a, f.b}) {
      tensors.push_back(t.detach().clone());
      tensors.push_back(t.grad().defined() ? t.grad().clone() : torch::Tensor());
    }
  }
  bool operator==(const Snapshot& o) const {
    if (core != o.core || paddle != o.paddle || core_scale != o.core_scale ||
        paddle_scale != o.paddle_scale) {
      return false;
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].defined() != o.tensors[i].defined() ||
          (tensors[i].defined() && !tensors[i].equal(o.tensors[i]))) {
        return false;
      }
    }
    return true;
  }
};

struct Row {
  const char* id;
  Err type;
  const char* needle;
  std::function<void(Fixture&)> setup, call;
};

const std::vector<Row>& rows() {
  static const std::vector<Row> table = {
      {"E01", Err::kValue, "init_scale must be a finite number > 0, got nan",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().init_scale(NAN));
       }},
      {"E02", Err::kValue, "init_scale must be a finite number > 0, got 0",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().init_scale(0));
       }},
      {"E03", Err::kValue, "init_scale must be a finite number > 0, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().init_scale(-1));
       }},
      {"E04", Err::kValue, "init_scale must be a finite number > 0, got inf",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().init_scale(INFINITY));
       }},
      {"E05", Err::kValue, "init_scale must be representable as a finite float32",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().init_scale(1e39));
       }},
      {"E06", Err::kValue, "growth_factor must be a finite number > 1.0, got 1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().growth_factor(1));
       }},
      {"E07", Err::kValue, "growth_factor must be a finite number > 1.0, got inf",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().growth_factor(INFINITY));
       }},
      {"E08", Err::kValue, "backoff_factor must be in (0, 1), got 0", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().backoff_factor(0));
       }},
      {"E09", Err::kValue, "backoff_factor must be in (0, 1), got 1.5", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().backoff_factor(1.5));
       }},
      {"E10", Err::kValue, "growth_interval must be >= 1, got 0", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().growth_interval(0));
       }},
      {"E11", Err::kValue, "backoff_interval must be >= 1, got -1", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().backoff_interval(-1));
       }},
      {"E12", Err::kValue, "min_scale must be a finite number >= 0 (0: no floor), got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().min_scale(-1));
       }},
      {"E13", Err::kValue, "max_consecutive_skips must be >= 0, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().max_consecutive_skips(-1));
       }},
      {"E14", Err::kValue, "growth_factor must be a finite number > 1.0, got 0.5",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         GradScaler(GradScalerOptions().enabled(false).growth_factor(0.5));
       }},
      {"E15", Err::kValue, "growth_factor must be a finite number > 1.0, got 0.5",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.set_growth_factor(0.5);
       }},
      {"E16", Err::kValue, "backoff_factor must be in (0, 1), got nan", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.set_backoff_factor(NAN);
       }},
      {"E17", Err::kValue, "growth_interval must be >= 1, got 0", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.set_growth_interval(0);
       }},
      {"E18", Err::kValue, "backoff_interval must be >= 1, got 0", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.set_backoff_interval(0);
       }},
      {"E19", Err::kValue, "min_scale must be a finite number >= 0 (0: no floor), got inf",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.set_min_scale(INFINITY);
       }},
      {"E20", Err::kValue, "max_consecutive_skips must be >= 0, got -3",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.set_max_consecutive_skips(-3);
       }},
      {"E21", Err::kValue, "register_parameter_name: the parameter 'w' is undefined",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.register_parameter_name("w", torch::Tensor());
       }},
      {"E22", Err::kValue, "scale must be a finite number > 0, got -2", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.update(-2.0);
       }},
      {"E23", Err::kValue, "scale must be a finite number > 0, got nan",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.update(NAN);
       }},
      {"E24", Err::kValue, "scale must be representable as a finite float32",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.update(1e39);
       }},
      {"E25", Err::kValue, "GradScaler::scale: the output tensor is undefined",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.scale(torch::Tensor());
       }},
      {"E26", Err::kValue, "GradScaler::scale: outputs[1] is undefined",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.scale(std::vector<torch::Tensor>{torch::ones({1}), torch::Tensor()});
       }},
      {"E27", Err::kValue,
       "Attempting to unscale FP16 gradients: param_groups[0].params[1] has a Half gradient",
       [](Fixture& f) {
         (void)f;
         f.b.mutable_grad() = torch::ones({3}, torch::kHalf);
       },
       [](Fixture& f) {
         (void)f;
         f.core.unscale_(*f.opt);
       }},
      {"E28", Err::kValue,
       "Attempting to unscale FP16 gradients: param_groups[0].params[1] has a Half gradient",
       [](Fixture& f) {
         (void)f;
         f.b.mutable_grad() = torch::ones({3}, torch::kHalf);
       },
       [](Fixture& f) {
         (void)f;
         f.core.step(*f.opt);
       }},
      {"E29", Err::kNotImplemented,
       "GradScaler cannot unscale complex gradients: param_groups[0].params[1] has a ComplexFloat "
       "gradient",
       [](Fixture& f) {
         (void)f;
         f.b.mutable_grad() = torch::ones({3}, torch::kComplexFloat);
       },
       [](Fixture& f) {
         (void)f;
         f.core.unscale_(*f.opt);
       }},
      {"E30", Err::kNotImplemented,
       "GradScaler can unscale Float, Double and BFloat16 gradients only: "
       "param_groups[0].params[1] has a Int gradient",
       [](Fixture& f) {
         (void)f;
         f.b.mutable_grad() = torch::ones({3}, torch::kInt);
       },
       [](Fixture& f) {
         (void)f;
         f.core.unscale_(*f.opt);
       }},
      {"E31", Err::kNotImplemented, "param_groups[0].params[1] has a ComplexFloat gradient",
       [](Fixture& f) {
         (void)f;
         f.b.mutable_grad() = torch::ones({3}, torch::kComplexFloat);
       },
       [](Fixture& f) {
         (void)f;
         f.core.step(*f.opt);
       }},
      {"E32", Err::kRuntime,
       "unscale_() has already been called on this optimizer since the last update().",
       [](Fixture& f) {
         (void)f;
         f.core.unscale_(*f.opt);
       },
       [](Fixture& f) {
         (void)f;
         f.core.unscale_(*f.opt);
       }},
      {"E33", Err::kRuntime, "unscale_() is being called after step().",
       [](Fixture& f) {
         (void)f;
         f.core.step(*f.opt);
       },
       [](Fixture& f) {
         (void)f;
         f.core.unscale_(*f.opt);
       }},
      {"E34", Err::kRuntime, "step() has already been called since the last update().",
       [](Fixture& f) {
         (void)f;
         f.core.step(*f.opt);
       },
       [](Fixture& f) {
         (void)f;
         f.core.step(*f.opt);
       }},
      {"E35", Err::kRuntime, "No inf checks were recorded for this optimizer.",
       [](Fixture& f) {
         (void)f;
         f.clear_grads();
       },
       [](Fixture& f) {
         (void)f;
         f.core.step(*f.opt);
       }},
      {"E36", Err::kRuntime, "No inf checks were recorded prior to update.",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.update();
       }},
      {"E37", Err::kRuntime, "Closure use is not currently supported if GradScaler is enabled",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.step(*f.opt, [] { return torch::Tensor(); });
       }},
      {"E38", Err::kRuntime,
       "The source state dict is empty, possibly because it was saved from a disabled instance of "
       "GradScaler.",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(empty_dict());
       }},
      {"E39", Err::kValue, "state_dict is missing the key 'growth_factor'",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(without(f.core_dict(), "growth_factor"));
       }},
      {"E40", Err::kValue, "state_dict['scale'] must be a float, got String",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.core_dict(), "scale", c10::IValue("big")));
       }},
      {"E41", Err::kValue, "state_dict['growth_interval'] must be an int, got Double",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.core_dict(), "growth_interval", c10::IValue(2.0)));
       }},
      {"E42", Err::kValue, "state_dict['scale'] must be a finite number > 0, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.core_dict(), "scale", c10::IValue(-1.0)));
       }},
      {"E43", Err::kValue, "state_dict['_growth_tracker'] must be >= 0, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.core_dict(), "_growth_tracker", c10::IValue(-1)));
       }},
      {"E44", Err::kValue, "state_dict['dynamic'] must be a bool, got Int",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.core_dict(), "dynamic", c10::IValue(1)));
       }},
      {"E45", Err::kValue, "state_dict['min_scale'] must be a finite number >= 0",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.core_dict(), "min_scale", c10::IValue(NAN)));
       }},
      {"E46", Err::kValue,
       "state_dict mixes PyTorch's schema (key 'growth_factor') and Paddle's (key 'incr_ratio')",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.core_dict(), "incr_ratio", c10::IValue(2.0)));
       }},
      {"E47", Err::kValue, "state_dict is missing the key 'decr_count'",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(without(f.paddle_dict(), "decr_count"));
       }},
      {"E48", Err::kValue, "state_dict['scale'] must be a 1-element floating-point tensor",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.load_state_dict(with(f.paddle_dict(), "scale", c10::IValue(torch::ones({2}))));
       }},
      {"E49", Err::kValue, "init_loss_scaling must be a finite number > 0, got 0",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         paddle::GradScaler(true, 0);
       }},
      {"E50", Err::kValue, "incr_ratio must be a finite number > 1.0, got 1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         paddle::GradScaler(true, 1024, 1.0);
       }},
      {"E51", Err::kValue, "decr_ratio must be in (0, 1), got 0", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         paddle::GradScaler(true, 1024, 2.0, 0.0);
       }},
      {"E52", Err::kValue, "incr_every_n_steps must be >= 1, got 0", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         paddle::GradScaler(true, 1024, 2.0, 0.5, 0);
       }},
      {"E53", Err::kValue, "decr_every_n_nan_or_inf must be >= 1, got 0",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         paddle::GradScaler(true, 1024, 2.0, 0.5, 10, 0);
       }},
      {"E54", Err::kValue, "init_loss_scaling must be a finite number > 0, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.set_init_loss_scaling(-1);
       }},
      {"E55", Err::kValue, "incr_ratio must be a finite number > 1.0, got nan",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.set_incr_ratio(NAN);
       }},
      {"E56", Err::kValue, "decr_ratio must be in (0, 1), got 1", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.set_decr_ratio(1);
       }},
      {"E57", Err::kValue, "incr_every_n_steps must be >= 1, got 0", [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.set_incr_every_n_steps(0);
       }},
      {"E58", Err::kValue, "decr_every_n_nan_or_inf must be >= 1, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.set_decr_every_n_nan_or_inf(-1);
       }},
      {"E59", Err::kNotImplemented,
       "GradScaler cannot unscale complex gradients: param_groups[0].params[1]",
       [](Fixture& f) {
         (void)f;
         f.b.mutable_grad() = torch::ones({3}, torch::kComplexFloat);
       },
       [](Fixture& f) {
         (void)f;
         f.paddle.unscale_(*f.opt);
       }},
      {"E60", Err::kRuntime, "step() has already been called since the last update().",
       [](Fixture& f) {
         (void)f;
         f.paddle.step(*f.opt);
       },
       [](Fixture& f) {
         (void)f;
         f.paddle.minimize(*f.opt);
       }},
      {"E61", Err::kRuntime,
       "The input state dict is empty, possibly because it was saved from a disabled instance of "
       "GradScaler.",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.load_state_dict(empty_dict());
       }},
      {"E62", Err::kValue, "state_dict['incr_count'] must be >= 0, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.load_state_dict(with(f.paddle_dict(), "incr_count", c10::IValue(-1)));
       }},
      {"E63", Err::kValue,
       "state_dict mixes PyTorch's schema (key '_growth_tracker') and Paddle's (key 'incr_ratio')",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.paddle.load_state_dict(with(f.paddle_dict(), "_growth_tracker", c10::IValue(0)));
       }},
      {"E64", Err::kValue, "autocast: dtype Float is not supported on cpu",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         torchamp::autocast g(torch::kCPU, torch::kFloat);
       }},
      {"E65", Err::kValue, "autocast: dtype Double is not supported on cuda",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         torchamp::autocast g(torch::kCUDA, torch::kDouble);
       }},
      {"E66", Err::kValue, "autocast: device_type must be CPU or CUDA, got meta",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         torchamp::autocast g(torch::kMeta);
       }},
      {"E67", Err::kValue, "all_reduce_found_inf: the process group is null",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
#if TORCHAMP_WITH_DISTRIBUTED
         torchamp::all_reduce_found_inf({});
#else
         TORCH_CHECK_VALUE(false, "all_reduce_found_inf: the process group is null");
#endif
       }},
      {"E68", Err::kValue, "GradScaler::clip_grad_norm_: max_norm must be finite and >= 0, got -1",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         f.core.clip_grad_norm_(*f.opt, -1.0);
       }},
      {"E69", Err::kValue, "Attempting to unscale FP16 gradients: param_groups[0].params[1]",
       [](Fixture& f) {
         (void)f;
         f.b.mutable_grad() = torch::ones({3}, torch::kHalf);
       },
       [](Fixture& f) {
         (void)f;
         f.core.clip_grad_norm_(*f.opt, 1.0);
       }},
      {"E70", Err::kType, "torchamp::checkpoint: the function is empty",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         torchamp::checkpoint(torchamp::CheckpointFunction(), std::vector<torch::Tensor>{f.a});
       }},
      {"E71", Err::kValue,
       "torchamp::checkpoint: determinism_check must be \"default\" or \"none\", got \"all\"",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         torchamp::checkpoint([](const torch::Tensor& t) { return t * 2; }, f.a,
                              torchamp::CheckpointOptions().determinism_check("all"));
       }},
      {"E72", Err::kType, "torchamp::checkpoint_sequential: the Sequential holder is empty",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) { torchamp::checkpoint_sequential(torch::nn::Sequential(nullptr), 1, f.a); }},
      {"E73", Err::kValue, "torchamp::checkpoint_sequential: segments must be at least 1, got 0",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         torchamp::checkpoint_sequential(torch::nn::Sequential(torch::nn::Tanh()), 0, f.a);
       }},
      {"E74", Err::kValue,
       "torchamp::checkpoint_sequential: 3 segments for a Sequential of 2 modules",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         torchamp::checkpoint_sequential(
             torch::nn::Sequential(torch::nn::Tanh(), torch::nn::ReLU()), 3, f.a);
       }},
      {"E75", Err::kNotImplemented, "pass that tensor as an input instead of capturing it",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         const auto twice = f.b * 2;  // a non-leaf whose history reaches b, used too
         torchamp::checkpoint([&](const torch::Tensor& t) { return t * twice + f.b; }, f.a);
       }},
      {"E76", Err::kNotImplemented, "torchamp::checkpoint: outputs 0 and 1 share memory",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         torchamp::checkpoint(
             [](const torch::Tensor& t) {
               const auto h = t * 2;
               return std::make_tuple(h, h.view({3, 1}));
             },
             f.a);
       }},
      {"E77", Err::kRuntime, "torchamp::checkpoint: the function modified its input 0 in place",
       [](Fixture& f) { (void)f; },
       [](Fixture& f) {
         (void)f;
         const auto t = torch::ones({3});
         torchamp::checkpoint([&](const torch::Tensor& u) { return f.a * u.mul_(2); }, t);
       }},
  };
  return table;
}

class ErrorsTable : public ::testing::TestWithParam<size_t> {};

TEST_P(ErrorsTable, TypedNamedAndNothingChanged) {
  const Row& row = rows()[GetParam()];
  Fixture f;
  row.setup(f);
  const Snapshot before(f);
  std::string message;
  Err got = Err::kRuntime;
  bool threw = false;
  try {
    row.call(f);
  } catch (const c10::ValueError& e) {
    threw = true;
    got = Err::kValue;
    message = e.what_without_backtrace();
  } catch (const c10::NotImplementedError& e) {
    threw = true;
    got = Err::kNotImplemented;
    message = e.what_without_backtrace();
  } catch (const c10::TypeError& e) {
    threw = true;
    got = Err::kType;
    message = e.what_without_backtrace();
  } catch (const c10::Error& e) {
    threw = true;
    got = Err::kRuntime;
    message = e.what_without_backtrace();
  }
  ASSERT_TRUE(threw) << row.id << ": no exception";
  EXPECT_EQ(static_cast<int>(got), static_cast<int>(row.type)) << row.id << ": " << message;
  EXPECT_NE(message.find(row.needle), std::string::npos)
      << row.id << ": message '" << message << "' lacks '" << row.needle << "'";
  EXPECT_TRUE(Snapshot(f) == before) << row.id << ": state changed";
}

INSTANTIATE_TEST_SUITE_P(Rows, ErrorsTable, ::testing::Range<size_t>(0, rows().size()),
                         [](const auto& info) { return std::string(rows()[info.param].id); });

// docs/errors.md holds the same rows: id, type and message text.
TEST(ErrorsDoc, MatchesTheTestTable) {
  std::ifstream doc(std::string(torchamp_test_source_dir()) + "/docs/errors.md");
  ASSERT_TRUE(doc) << "docs/errors.md not found";
  // Rows look like: | E01 | `entry` | input | c10::ValueError | `message` |
  std::map<std::string, std::pair<std::string, std::string>> documented;
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| E", 0) != 0) {
      continue;
    }
    std::vector<std::string> cells;
    size_t pos = 1;
    for (size_t bar; (bar = line.find(" | ", pos)) != std::string::npos; pos = bar + 3) {
      cells.push_back(line.substr(pos, bar - pos));
    }
    cells.push_back(line.substr(pos, line.size() - pos - 2));  // before the closing " |"
    ASSERT_EQ(cells.size(), 5u) << line;
    auto unquote = [](const std::string& c) { return c.substr(1, c.size() - 2); };
    documented[cells[0].substr(1)] = {cells[3], unquote(cells[4])};
  }
  const char* names[] = {"c10::Error", "c10::ValueError", "c10::NotImplementedError",
                         "c10::TypeError"};
  ASSERT_EQ(documented.size(), rows().size());
  for (const Row& row : rows()) {
    ASSERT_TRUE(documented.count(row.id)) << row.id << " is not in docs/errors.md";
    EXPECT_EQ(documented[row.id].first, names[static_cast<int>(row.type)]) << row.id;
    EXPECT_EQ(documented[row.id].second, row.needle) << row.id;
  }
}

}  // namespace
