// torchamp::paddle::GradScaler: Paddle's API over the core. Golden values from
// Paddle's documentation (../shared/spec/001_*.txt) and the cases of Paddle's
// own tests (test_imperative_auto_mixed_precision: scale x1024, a NaN input
// leaves parameters unchanged and is recorded, stage errors, get/set, state).
#include <torchamp/autocast.h>
#include <torchamp/paddle.h>

#include "test_util.h"

#include <torch/torch.h>

#include <limits>

namespace {

using torchamp::StateDict;
using torchamp::paddle::GradScaler;
using torchamp_test::expect_throws;

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Everything a Paddle scaler shows.
struct PaddleSnapshot {
  bool enable, dynamic;
  double init, incr_ratio, decr_ratio, scale;
  int64_t incr_n, decr_n, incr_count, decr_count;
  explicit PaddleSnapshot(const GradScaler& s)
      : enable(s.is_enable()),
        dynamic(s.is_use_dynamic_loss_scaling()),
        init(s.get_init_loss_scaling()),
        incr_ratio(s.get_incr_ratio()),
        decr_ratio(s.get_decr_ratio()),
        scale(s.get_scale()),
        incr_n(s.get_incr_every_n_steps()),
        decr_n(s.get_decr_every_n_nan_or_inf()),
        incr_count(s.get_incr_count()),
        decr_count(s.get_decr_count()) {}
  bool operator==(const PaddleSnapshot& o) const {
    return enable == o.enable && dynamic == o.dynamic && init == o.init &&
           incr_ratio == o.incr_ratio && decr_ratio == o.decr_ratio && scale == o.scale &&
           incr_n == o.incr_n && decr_n == o.decr_n && incr_count == o.incr_count &&
           decr_count == o.decr_count;
  }
};

torch::Tensor param_with_grad(float g) {
  auto p = torch::zeros({1}, torch::requires_grad());
  p.mutable_grad() = torch::tensor({g});
  return p;
}

TEST(PaddleGradScaler, DocumentedDefaults) {
  GradScaler s;
  EXPECT_TRUE(s.is_enable());
  EXPECT_TRUE(s.is_use_dynamic_loss_scaling());
  EXPECT_EQ(s.get_init_loss_scaling(), 32768.0);
  EXPECT_EQ(s.get_scale(), 32768.0);
  EXPECT_EQ(s.get_incr_ratio(), 2.0);
  EXPECT_EQ(s.get_decr_ratio(), 0.5);
  EXPECT_EQ(s.get_incr_every_n_steps(), 1000);
  EXPECT_EQ(s.get_decr_every_n_nan_or_inf(), 2);
}

TEST(PaddleGradScaler, ConstructorValidatesUnderPaddlesNames) {
  expect_throws<c10::ValueError>([] { GradScaler(true, -1.0); },
                                 "init_loss_scaling must be a finite number > 0, got -1");
  expect_throws<c10::ValueError>([] { GradScaler(true, 1024, 1.0); },
                                 "incr_ratio must be a finite number > 1.0, got 1");
  expect_throws<c10::ValueError>([] { GradScaler(true, 1024, 2.0, 1.5); },
                                 "decr_ratio must be in (0, 1), got 1.5");
  expect_throws<c10::ValueError>([] { GradScaler(true, 1024, 2.0, 0.5, 0); },
                                 "incr_every_n_steps must be >= 1, got 0");
  expect_throws<c10::ValueError>([] { GradScaler(false, 1024, 2.0, 0.5, 10, -1); },
                                 "decr_every_n_nan_or_inf must be >= 1, got -1");
}

// The document's example, in C++: Conv2D(3, 2, 3), SGD 0.01, init 1024.
TEST(PaddleGradScaler, DocumentExampleScalesBy1024AndMinimizes) {
  torch::manual_seed(0);
  torch::nn::Conv2d model(torch::nn::Conv2dOptions(3, 2, 3).bias(true));
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  GradScaler scaler(true, 1024);
  auto data = torch::rand({10, 3, 32, 32});
  torch::Tensor loss;
  {
    torchamp::autocast guard(torch::kCPU);
    loss = model->forward(data).mean();
  }
  auto before = model->weight.clone();
  auto scaled = scaler.scale(loss);
  EXPECT_TRUE(scaled.equal(loss * 1024));
  scaled.backward();
  auto result = scaler.minimize(optimizer, scaled);
  EXPECT_TRUE(result.has_value());
  optimizer.zero_grad();
  EXPECT_FALSE(model->weight.equal(before));
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.get_incr_count(), 1);
}

TEST(PaddleGradScaler, NanInputLeavesParametersUnchangedAndIsRecorded) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.01);
  GradScaler scaler(true, 1024);
  auto data = torch::rand({3, 4});
  data[1][2] = kNaN;
  auto before = model->weight.clone();
  scaler.scale(model->forward(data).mean()).backward();
  EXPECT_FALSE(scaler.minimize(optimizer).has_value());
  EXPECT_TRUE(model->weight.equal(before));
  EXPECT_EQ(scaler.get_decr_count(), 1);  // found, not yet backed off (n = 2)
  EXPECT_EQ(scaler.get_scale(), 1024.0);
}

TEST(PaddleGradScaler, StageErrorsAreTheCores) {
  auto p = param_with_grad(1.0f);
  torch::optim::SGD opt({p}, 0.1);
  GradScaler s;
  s.unscale_(opt);
  expect_throws<c10::Error>([&] { s.unscale_(opt); },
                            "unscale_() has already been called on this optimizer");
  s.step(opt);
  expect_throws<c10::Error>([&] { s.unscale_(opt); }, "unscale_() is being called after step()");
  expect_throws<c10::Error>([&] { s.step(opt); }, "step() has already been called");
  s.update();
  expect_throws<c10::Error>([&] { s.update(); }, "No inf checks were recorded prior to update.");
}

// Runs updates through a real optimizer: 'i' = inf gradient, 'c' = clean.
std::vector<double> run(GradScaler& s, const std::string& updates, bool use_minimize) {
  auto p = param_with_grad(1.0f);
  torch::optim::SGD opt({p}, 0.1);
  std::vector<double> scales;
  for (char u : updates) {
    p.mutable_grad() = torch::tensor({u == 'i' ? kInf : 1.0f});
    if (use_minimize) {
      s.minimize(opt);
    } else {
      s.step(opt);
      s.update();
    }
    scales.push_back(s.get_scale());
  }
  return scales;
}

TEST(PaddleGradScaler, HysteresisExampleFromTheIssue) {
  GradScaler s(true, 1024, 2.0, 0.5, 1000, 2);
  EXPECT_EQ(run(s, "icii", false), (std::vector<double>{1024, 1024, 1024, 512}));
}

TEST(PaddleGradScaler, HysteresisTable) {
  struct Case {
    int64_t incr_n, decr_n;
    const char* updates;
    std::vector<double> scales;
  };
  const std::vector<Case> cases = {
      {1000, 2, "iiii", {1024, 512, 512, 256}},
      {1000, 1, "icic", {512, 512, 256, 256}},
      {2, 2, "ccicci", {1024, 2048, 2048, 2048, 4096, 4096}},
      {2, 3, "iicciii", {1024, 1024, 1024, 2048, 2048, 2048, 1024}},
      {3, 2, "ciccc", {1024, 1024, 1024, 1024, 2048}},
      {1, 2, "icicii", {1024, 2048, 2048, 4096, 4096, 2048}},
  };
  for (bool use_minimize : {false, true}) {
    for (const auto& c : cases) {
      GradScaler s(true, 1024, 2.0, 0.5, c.incr_n, c.decr_n);
      EXPECT_EQ(run(s, c.updates, use_minimize), c.scales)
          << "incr_every_n_steps " << c.incr_n << " decr_every_n_nan_or_inf " << c.decr_n
          << " updates " << c.updates;
    }
  }
}

TEST(PaddleGradScaler, FixedScaleStillUnscalesChecksAndSkips) {
  GradScaler s(true, 8, 2.0, 0.5, 1, 1, /*use_dynamic_loss_scaling=*/false);
  auto p = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD opt({p}, 1.0);
  p.mutable_grad() = torch::tensor({16.0f, 8.0f});
  s.unscale_(opt);
  EXPECT_TRUE(p.grad().equal(torch::tensor({2.0f, 1.0f})));
  EXPECT_TRUE(s.step(opt).has_value());
  s.update();
  p.mutable_grad() = torch::tensor({kInf, 8.0f});
  auto before = p.clone();
  EXPECT_FALSE(s.minimize(opt).has_value());
  EXPECT_TRUE(p.equal(before));
  EXPECT_EQ(s.get_scale(), 8.0);
  EXPECT_FALSE(s.is_use_dynamic_loss_scaling());
}

TEST(PaddleGradScaler, GettersSettersRoundTripAndBadValuesChangeNothing) {
  GradScaler s;
  s.set_init_loss_scaling(512);
  EXPECT_EQ(s.get_init_loss_scaling(), 512.0);
  EXPECT_EQ(s.get_scale(), 512.0);  // also resets the current scale
  s.set_incr_ratio(3.0);
  s.set_decr_ratio(0.25);
  s.set_incr_every_n_steps(7);
  s.set_decr_every_n_nan_or_inf(4);
  EXPECT_EQ(s.get_incr_ratio(), 3.0);
  EXPECT_EQ(s.get_decr_ratio(), 0.25);
  EXPECT_EQ(s.get_incr_every_n_steps(), 7);
  EXPECT_EQ(s.get_decr_every_n_nan_or_inf(), 4);
  const PaddleSnapshot before(s);
  expect_throws<c10::ValueError>([&] { s.set_init_loss_scaling(0); }, "init_loss_scaling");
  expect_throws<c10::ValueError>([&] { s.set_incr_ratio(0.5); }, "incr_ratio");
  expect_throws<c10::ValueError>([&] { s.set_decr_ratio(1.0); }, "decr_ratio");
  expect_throws<c10::ValueError>([&] { s.set_incr_every_n_steps(0); }, "incr_every_n_steps");
  expect_throws<c10::ValueError>([&] { s.set_decr_every_n_nan_or_inf(0); },
                                 "decr_every_n_nan_or_inf");
  EXPECT_EQ(PaddleSnapshot(s), before);
}

TEST(PaddleGradScaler, StateDictHasPaddlesEightKeys) {
  GradScaler s(true, 1024, 2.0, 0.5, 1000, 2);
  run(s, "cci", false);
  auto sd = s.state_dict();
  EXPECT_EQ(sd.size(), 8u);
  const auto scale = sd.at("scale").toTensor();
  EXPECT_EQ(scale.scalar_type(), torch::kFloat);
  EXPECT_EQ(scale.numel(), 1);
  EXPECT_EQ(scale.item<float>(), 1024.0f);
  EXPECT_EQ(sd.at("incr_ratio").toDouble(), 2.0);
  EXPECT_EQ(sd.at("decr_ratio").toDouble(), 0.5);
  EXPECT_EQ(sd.at("incr_every_n_steps").toInt(), 1000);
  EXPECT_EQ(sd.at("decr_every_n_nan_or_inf").toInt(), 2);
  EXPECT_EQ(sd.at("incr_count").toInt(), 0);
  EXPECT_EQ(sd.at("decr_count").toInt(), 1);
  EXPECT_TRUE(sd.at("use_dynamic_loss_scaling").toBool());
}

TEST(PaddleGradScaler, StateDictRoundTripWithNonDefaultValuesEverywhere) {
  GradScaler s(true, 3.0, 4.0, 0.125, 5, 3, true);
  run(s, "ccicc", false);  // incr_count 2, decr_count 0
  run(s, "ii", false);     // decr_count 2 < 3, incr_count 0
  s.set_init_loss_scaling(96.0);
  run(s, "c", false);  // incr_count 1, decr_count 0
  auto sd = s.state_dict();
  sd.insert_or_assign("decr_count", int64_t{2});
  sd.insert_or_assign("use_dynamic_loss_scaling", false);
  auto bytes = torch::pickle_save(sd);
  GradScaler t;
  t.load_state_dict(torch::pickle_load(bytes).toGenericDict());
  EXPECT_EQ(t.get_scale(), 96.0);
  EXPECT_EQ(t.get_init_loss_scaling(), 96.0);
  EXPECT_EQ(t.get_incr_ratio(), 4.0);
  EXPECT_EQ(t.get_decr_ratio(), 0.125);
  EXPECT_EQ(t.get_incr_every_n_steps(), 5);
  EXPECT_EQ(t.get_decr_every_n_nan_or_inf(), 3);
  EXPECT_EQ(t.get_incr_count(), 1);
  EXPECT_EQ(t.get_decr_count(), 2);
  EXPECT_FALSE(t.is_use_dynamic_loss_scaling());
  auto again = t.state_dict();
  for (const auto& kv : sd) {
    if (kv.key().toStringRef() == "scale") {
      EXPECT_TRUE(again.at("scale").toTensor().equal(kv.value().toTensor()));
    } else {
      EXPECT_EQ(again.at(kv.key()), kv.value()) << kv.key().toStringRef();
    }
  }
}

TEST(PaddleGradScaler, LoadErrorsNameTheKeyAndChangeNothing) {
  GradScaler s(true, 64);
  const PaddleSnapshot before(s);
  expect_throws<c10::Error>(
      [&] { s.load_state_dict(StateDict(c10::StringType::get(), c10::AnyType::get())); },
      "The input state dict is empty, possibly because it was saved from a disabled instance "
      "of GradScaler.");
  const StateDict good = GradScaler(true, 8).state_dict();
  struct Bad {
    const char* key;
    c10::IValue value;
    const char* needle;
  };
  const std::vector<Bad> bads = {
      {"scale", c10::IValue(torch::ones({2})), "state_dict['scale'] must be a 1-element"},
      {"scale", c10::IValue(torch::full({1}, -1.0f)), "state_dict['scale'] must be a finite"},
      {"incr_ratio", c10::IValue(1.0), "state_dict['incr_ratio']"},
      {"decr_ratio", c10::IValue("half"), "state_dict['decr_ratio'] must be a float"},
      {"incr_every_n_steps", c10::IValue(0), "state_dict['incr_every_n_steps']"},
      {"decr_every_n_nan_or_inf", c10::IValue(1.5), "state_dict['decr_every_n_nan_or_inf']"},
      {"incr_count", c10::IValue(-1), "state_dict['incr_count']"},
      {"decr_count", c10::IValue(-1), "state_dict['decr_count']"},
      {"use_dynamic_loss_scaling", c10::IValue(0), "state_dict['use_dynamic_loss_scaling']"},
  };
  for (const auto& bad : bads) {
    auto sd = good.copy();
    sd.insert_or_assign(bad.key, bad.value);
    expect_throws<c10::ValueError>([&] { s.load_state_dict(sd); }, bad.needle);
    EXPECT_EQ(PaddleSnapshot(s), before) << bad.key;
  }
  auto partial = good.copy();
  ASSERT_EQ(partial.erase("decr_count"), 1u);
  expect_throws<c10::ValueError>([&] { s.load_state_dict(partial); },
                                 "state_dict is missing the key 'decr_count'");
  auto mixed = good.copy();
  mixed.insert("growth_factor", 2.0);
  expect_throws<c10::ValueError>([&] { s.load_state_dict(mixed); }, "mixes PyTorch's schema");
  EXPECT_EQ(PaddleSnapshot(s), before);
}

TEST(PaddleGradScaler, DisabledStaysDisabled) {
  GradScaler s(/*enable=*/false);
  EXPECT_FALSE(s.is_enable());
  EXPECT_EQ(s.state_dict().size(), 0u);
  s.load_state_dict(GradScaler(true, 8).state_dict());
  EXPECT_FALSE(s.is_enable());
  EXPECT_EQ(s.get_scale(), 1.0);
  auto t = torch::ones({2});
  EXPECT_TRUE(s.scale(t).is_same(t));
  auto p = param_with_grad(kInf);
  torch::optim::SGD opt({p}, 1.0);
  EXPECT_TRUE(s.minimize(opt).has_value());  // plain optimizer step
  EXPECT_FALSE(s.is_enable());
}

// Paddle's own test (test/amp/test_grad_scaler_out.py, test_disabled_scaler)
// expects a disabled scaler's initial loss scaling to be 1.0 whatever was
// passed: Paddle's __init__ sets `_init_loss_scaling = 1.0` and
// `_use_dynamic_loss_scaling = False` before `if self._enable:`, and its
// setters still work. The ratio and interval getters raise AttributeError in
// Paddle (never set when disabled); torchamp returns the configured values.
TEST(PaddleGradScaler, DisabledGettersAreWhatPaddleReports) {
  GradScaler s(/*enable=*/false, /*init_loss_scaling=*/1024, 3.0, 0.25, 9, 4);
  EXPECT_FALSE(s.is_enable());
  EXPECT_EQ(s.get_init_loss_scaling(), 1.0);
  EXPECT_FALSE(s.is_use_dynamic_loss_scaling());
  EXPECT_EQ(s.get_scale(), 1.0);  // PyTorch's disabled get_scale()
  EXPECT_EQ(s.get_incr_ratio(), 3.0);
  EXPECT_EQ(s.get_decr_ratio(), 0.25);
  EXPECT_EQ(s.get_incr_every_n_steps(), 9);
  EXPECT_EQ(s.get_decr_every_n_nan_or_inf(), 4);
  EXPECT_EQ(GradScaler(false).get_init_loss_scaling(), 1.0);
  s.set_init_loss_scaling(64);  // Paddle's setter works when disabled
  EXPECT_EQ(s.get_init_loss_scaling(), 64.0);
  EXPECT_EQ(s.get_scale(), 1.0);
  EXPECT_EQ(GradScaler(true).get_init_loss_scaling(), 32768.0);
  EXPECT_TRUE(GradScaler(true).is_use_dynamic_loss_scaling());
}

// ---- checkpoints across schemas --------------------------------------------

TEST(CrossSchema, CoreLoadsPaddlesSchema) {
  GradScaler paddle(true, 256, 3.0, 0.25, 9, 4, false);
  run(paddle, "c", false);
  torchamp::GradScaler core;
  core.load_state_dict(paddle.state_dict());
  EXPECT_EQ(core.get_scale(), 256.0);
  EXPECT_EQ(core.get_growth_factor(), 3.0);
  EXPECT_EQ(core.get_backoff_factor(), 0.25);
  EXPECT_EQ(core.get_growth_interval(), 9);
  EXPECT_EQ(core.get_backoff_interval(), 4);
  EXPECT_FALSE(core.is_dynamic());
}

TEST(CrossSchema, PaddleLoadsTheCoresSchemaIncludingPyTorchsFiveKeys) {
  torchamp::GradScaler core(torchamp::GradScalerOptions()
                                .init_scale(128)
                                .growth_factor(8)
                                .backoff_factor(0.125)
                                .growth_interval(11)
                                .backoff_interval(5));
  GradScaler paddle;
  paddle.load_state_dict(core.state_dict());
  EXPECT_EQ(paddle.get_scale(), 128.0);
  EXPECT_EQ(paddle.get_init_loss_scaling(), 128.0);
  EXPECT_EQ(paddle.get_incr_ratio(), 8.0);
  EXPECT_EQ(paddle.get_decr_ratio(), 0.125);
  EXPECT_EQ(paddle.get_incr_every_n_steps(), 11);
  EXPECT_EQ(paddle.get_decr_every_n_nan_or_inf(), 5);
  // PyTorch's own five keys: Paddle's hysteresis setting stays as it was.
  auto five = core.state_dict();
  for (const char* key : {"backoff_interval", "_backoff_tracker", "dynamic"}) {
    ASSERT_EQ(five.erase(key), 1u);
  }
  GradScaler other(true, 1, 2, 0.5, 3, 7);
  other.load_state_dict(five);
  EXPECT_EQ(other.get_decr_every_n_nan_or_inf(), 7);
  EXPECT_EQ(other.get_incr_every_n_steps(), 11);
}

TEST(CrossSchema, TorchSaveAndLoadForBothClassesAndAcross) {
  const std::string dir = ::testing::TempDir();
  torchamp::GradScaler core(torchamp::GradScalerOptions().init_scale(64).growth_interval(5));
  GradScaler paddle(true, 2048, 4.0, 0.25, 6, 3);
  run(paddle, "ci", false);
  torch::save(core, dir + "/core.pt");
  torch::save(paddle, dir + "/paddle.pt");

  torchamp::GradScaler core2;
  torch::load(core2, dir + "/core.pt");
  EXPECT_EQ(core2.get_scale(), 64.0);
  EXPECT_EQ(core2.get_growth_interval(), 5);
  GradScaler paddle2;
  torch::load(paddle2, dir + "/paddle.pt");
  EXPECT_EQ(PaddleSnapshot(paddle2), PaddleSnapshot(paddle));

  torchamp::GradScaler from_paddle;
  torch::load(from_paddle, dir + "/paddle.pt");
  EXPECT_EQ(from_paddle.get_scale(), 2048.0);
  EXPECT_EQ(from_paddle.get_backoff_tracker(), 1);
  GradScaler from_core;
  torch::load(from_core, dir + "/core.pt");
  EXPECT_EQ(from_core.get_scale(), 64.0);
  EXPECT_EQ(from_core.get_incr_every_n_steps(), 5);
}

}  // namespace
