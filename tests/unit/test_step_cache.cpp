// What the fused optimizers keep between steps (torchamp::optim::StepCache):
// every change to param groups, gradients or state made between scaled steps
// is seen before anything is written. After each change an optimizer with a
// warm cache and a fresh copy of it (same groups, parameters, gradients and
// state, cold cache) take the same scaled step: they must agree bit for bit.
#include "compat/compat.h"
#include "test_util.h"

#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr double kScale = 1024.0;

std::vector<at::Tensor> all_params(const torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& g : opt.param_groups()) {
    for (const auto& p : g.params()) {
      out.push_back(p);
    }
  }
  return out;
}

// Scaled gradients of seed `seed` for every parameter, in group order.
void set_scaled_grads(torch::optim::Optimizer& opt, int64_t seed) {
  torch::manual_seed(seed);
  for (auto& p : all_params(opt)) {
    p.mutable_grad() = torch::randn(p.sizes()).to(p.scalar_type()) * kScale;
  }
}

// `to` takes `from`'s state through save/load, as a checkpoint would.
void copy_state(torch::optim::Optimizer& from, torch::optim::Optimizer& to) {
  torch::serialize::OutputArchive out;
  from.save(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  to.load(in);
}

// A copy with the same groups, options, parameters, gradients and state
// (through save/load), and a cold cache.
template <class Opt, class Options>
std::unique_ptr<Opt> cold_copy(Opt& warm) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& g : warm.param_groups()) {
    std::vector<at::Tensor> ps;
    for (const auto& p : g.params()) {
      // Same strides: a non-contiguous parameter stays one.
      auto c = at::empty_strided(p.sizes(), p.strides(), p.options()).copy_(p.detach());
      if (p.grad().defined()) {
        c.mutable_grad() = p.grad().clone();
      }
      ps.push_back(c);
    }
    groups.emplace_back(ps, g.options().clone());
  }
  auto cold =
      std::make_unique<Opt>(std::move(groups), static_cast<const Options&>(warm.defaults()));
  copy_state(warm, *cold);
  return cold;
}

// Every state tensor and step count, in group order.
template <class State>
std::vector<at::Tensor> state_of(const torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& p : all_params(opt)) {
    const auto it = opt.state().find(torchamp::compat::optim_state_key(opt.state(), p));
    if (it == opt.state().end()) {
      out.push_back(at::Tensor());
      continue;
    }
    if constexpr (std::is_same_v<State, torch::optim::SGDParamState>) {
      out.push_back(static_cast<const State&>(*it->second).momentum_buffer());
    } else {
      const auto& st = static_cast<const State&>(*it->second);
      out.push_back(st.exp_avg());
      out.push_back(st.exp_avg_sq());
      out.push_back(torch::tensor({st.step()}));
    }
  }
  return out;
}

void expect_same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].defined(), b[i].defined()) << what << ": tensor " << i;
    if (a[i].defined()) {
      EXPECT_TRUE(a[i].scalar_type() == b[i].scalar_type() && torch::equal(a[i], b[i]))
          << what << ": tensor " << i << " differs";
    }
  }
}

using Change = std::function<void(torch::optim::Optimizer&)>;

// Three scaled steps warm the cache; `change`; then two more scaled steps of
// the warm optimizer and of a cold copy made after the change.
template <class Opt, class Options, class State>
void cache_sees(const Options& options, const char* what, const Change& change,
                bool fused_after = true) {
  torch::manual_seed(0);
  std::vector<at::Tensor> ps;
  for (int64_t n : {5, 100, 33, 1000}) {
    ps.push_back(torch::randn({n}));
  }
  Opt warm(ps, options);
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(kScale));
  for (int s = 0; s < 3; ++s) {
    set_scaled_grads(warm, s);
    ASSERT_TRUE(scaler.step(warm).has_value()) << what;
    scaler.update(kScale);
  }
  change(warm);
  set_scaled_grads(warm, 10);
  auto cold = cold_copy<Opt, Options>(warm);
  EXPECT_EQ(std::as_const(warm).supports_amp_scaling(), fused_after) << what;  // the question
  EXPECT_EQ(warm.prepare_amp_step(), fused_after) << what;  // the warm cache's walk
  torchamp::GradScaler cold_scaler(torchamp::GradScalerOptions().init_scale(kScale));
  for (int s = 0; s < 2; ++s) {
    if (s > 0) {
      set_scaled_grads(warm, 11);
      set_scaled_grads(*cold, 11);
    }
    scaler.step(warm);
    cold_scaler.step(*cold);
    scaler.update(kScale);
    cold_scaler.update(kScale);
    expect_same(all_params(warm), all_params(*cold), std::string(what) + ": parameters");
    expect_same(state_of<State>(warm), state_of<State>(*cold), std::string(what) + ": state");
  }
}

template <class State>
State& state_at(torch::optim::Optimizer& opt, size_t group, size_t index) {
  const at::Tensor& p = opt.param_groups()[group].params()[index];
  return static_cast<State&>(*opt.state().at(torchamp::compat::optim_state_key(opt.state(), p)));
}

using AdamW = torchamp::optim::AdamW;
using AdamWOptions = torch::optim::AdamWOptions;
using AdamWState = torch::optim::AdamWParamState;

void adamw_sees(const char* what, const Change& change, bool fused_after = true) {
  cache_sees<AdamW, AdamWOptions, AdamWState>(AdamWOptions(1e-2).weight_decay(0.1), what, change,
                                              fused_after);
}

TEST(StepCache, SeesALoadOfAnotherOptimizersState) {
  adamw_sees("load()", [](torch::optim::Optimizer& opt) {
    auto other_params = all_params(opt);
    for (auto& p : other_params) {
      p = p.detach().clone();
    }
    AdamW other(other_params, AdamWOptions(1e-2).weight_decay(0.1));
    for (int s = 0; s < 5; ++s) {
      set_scaled_grads(other, 50 + s);
      other.step();
    }
    copy_state(other, opt);
  });
}

TEST(StepCache, SeesANewParamGroup) {
  adamw_sees("add_param_group", [](torch::optim::Optimizer& opt) {
    opt.add_param_group(torch::optim::OptimizerParamGroup({torch::randn({77}), torch::randn({3})},
                                                          std::make_unique<AdamWOptions>(5e-3)));
  });
}

TEST(StepCache, SeesAParameterReplacedAddedOrRemoved) {
  adamw_sees("a parameter replaced", [](torch::optim::Optimizer& opt) {
    opt.param_groups()[0].params()[1] = torch::randn({100});
  });
  adamw_sees("a parameter added", [](torch::optim::Optimizer& opt) {
    opt.param_groups()[0].params().push_back(torch::randn({9}));
  });
  adamw_sees("a parameter removed",
             [](torch::optim::Optimizer& opt) { opt.param_groups()[0].params().pop_back(); });
}

TEST(StepCache, SeesAStateEntryReplacedOrErased) {
  adamw_sees("a state entry replaced", [](torch::optim::Optimizer& opt) {
    const at::Tensor& p = opt.param_groups()[0].params()[2];
    auto fresh = std::make_unique<AdamWState>();
    fresh->step(7);
    fresh->exp_avg(torch::rand_like(p));
    fresh->exp_avg_sq(torch::rand_like(p));
    opt.state()[torchamp::compat::optim_state_key(opt.state(), p)] = std::move(fresh);
  });
  adamw_sees("a state entry erased", [](torch::optim::Optimizer& opt) {
    const at::Tensor& p = opt.param_groups()[0].params()[1];
    opt.state().erase(torchamp::compat::optim_state_key(opt.state(), p));
  });
}

TEST(StepCache, SeesAStateTensorReplacedSwappedOrMadeUnfusable) {
  adamw_sees("a state tensor replaced", [](torch::optim::Optimizer& opt) {
    auto& st = state_at<AdamWState>(opt, 0, 3);
    st.exp_avg(torch::rand_like(st.exp_avg()));
  });
  adamw_sees("a state tensor's storage swapped in place", [](torch::optim::Optimizer& opt) {
    auto& st = state_at<AdamWState>(opt, 0, 1);
    st.exp_avg_sq().set_(torch::rand_like(st.exp_avg_sq()));
  });
  adamw_sees("a step count changed",
             [](torch::optim::Optimizer& opt) { state_at<AdamWState>(opt, 0, 0).step(100); });
  // A non-contiguous moment: the base class's step, on both.
  adamw_sees(
      "a state tensor made non-contiguous",
      [](torch::optim::Optimizer& opt) {
        auto& st = state_at<AdamWState>(opt, 0, 2);
        st.exp_avg(torch::zeros({33, 2}).select(1, 0).copy_(st.exp_avg()));
      },
      /*fused_after=*/false);
}

TEST(StepCache, SeesAParameterThatCannotBeFusedAndTheOptionsOfTheStep) {
  adamw_sees(
      "a non-contiguous parameter",
      [](torch::optim::Optimizer& opt) {
        opt.param_groups()[0].params()[1] = torch::randn({100, 2}).select(1, 0);
      },
      /*fused_after=*/false);
  adamw_sees("a new learning rate", [](torch::optim::Optimizer& opt) {
    static_cast<AdamWOptions&>(opt.param_groups()[0].options()).lr(0.5);
  });
}

TEST(StepCache, SgdSeesItsMomentumBufferReplacedOrErased) {
  using SGD = torchamp::optim::SGD;
  using State = torch::optim::SGDParamState;
  const auto options = torch::optim::SGDOptions(1e-2).momentum(0.9);
  cache_sees<SGD, torch::optim::SGDOptions, State>(
      options, "a momentum buffer replaced", [](torch::optim::Optimizer& opt) {
        auto& st = state_at<State>(opt, 0, 1);
        st.momentum_buffer(torch::rand_like(st.momentum_buffer()));
      });
  cache_sees<SGD, torch::optim::SGDOptions, State>(
      options, "a momentum state erased", [](torch::optim::Optimizer& opt) {
        const at::Tensor& p = opt.param_groups()[0].params()[0];
        opt.state().erase(torchamp::compat::optim_state_key(opt.state(), p));
      });
}

// amp_step alone (no prepare_amp_step() before it) walks for itself,
// and throws before writing anything when the step cannot be fused.
TEST(StepCache, AmpStepAloneRefusesAnUnfusableStepWritingNothing) {
  std::vector<at::Tensor> ps = {torch::randn({10}), torch::randn({10})};
  AdamW opt(ps, AdamWOptions(1e-2));
  set_scaled_grads(opt, 0);
  opt.amp_step(torchamp::AmpStepArgs{static_cast<float>(kScale), false});  // creates the state
  const auto before_params = all_params(opt);
  std::vector<at::Tensor> copies;
  for (const auto& p : before_params) {
    copies.push_back(p.clone());
  }
  const auto before_state = state_of<AdamWState>(opt);
  std::vector<at::Tensor> state_copies;
  for (const auto& t : before_state) {
    state_copies.push_back(t.clone());
  }
  ps[1].mutable_grad() = torch::randn({10}).to(at::kDouble);
  EXPECT_THROW(opt.amp_step(torchamp::AmpStepArgs{static_cast<float>(kScale), false}), c10::Error);
  expect_same(all_params(opt), copies, "parameters after a refused amp_step");
  expect_same(state_of<AdamWState>(opt), state_copies, "state after a refused amp_step");
}

}  // namespace
