// The one key table (src/scaler/state_keys.h): every key of every schema survives
// every save and load path, with a non-default value in each, and a dict of
// the reference page's framework (lucid) loads. Python's side of the round
// trip (torch.load / torch.save of the dict itself) is
// tests/integration/python/test_checkpoint_interop.py.
#include <torchamp/grad_scaler.h>
#include <torchamp/paddle.h>

#include "state_dicts.h"
#include "test_util.h"

#include <torch/torch.h>

#include <cstdio>
#include <string>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;
using torchamp::StateDict;
using torchamp_test::expect_throws;

using torchamp_test::core_dict;
using torchamp_test::paddle_dict;

StateDict dict() {
  return torchamp_test::empty_dict();
}

// The values every path must bring back (the core dict's).
void expect_core_values(const GradScaler& s, const std::string& how) {
  EXPECT_EQ(s.get_scale(), 384.0) << how;
  EXPECT_EQ(s.options().init_scale(), 384.0) << how;
  EXPECT_EQ(s.get_growth_factor(), 3.0) << how;
  EXPECT_EQ(s.get_backoff_factor(), 0.25) << how;
  EXPECT_EQ(s.get_growth_interval(), 7) << how;
  EXPECT_EQ(s.get_growth_tracker(), 3) << how;
  EXPECT_EQ(s.get_backoff_interval(), 4) << how;
  EXPECT_EQ(s.get_backoff_tracker(), 2) << how;
  EXPECT_FALSE(s.is_dynamic()) << how;
  EXPECT_EQ(s.get_min_scale(), 1.5) << how;
  EXPECT_EQ(s.get_max_consecutive_skips(), 9) << how;
  EXPECT_EQ(s.get_consecutive_skips(), 5) << how;
  // options() is derived from the same state.
  EXPECT_EQ(s.options().min_scale(), 1.5) << how;
  EXPECT_EQ(s.options().max_consecutive_skips(), 9) << how;
  EXPECT_EQ(s.options().backoff_interval(), 4) << how;
  EXPECT_FALSE(s.options().dynamic()) << how;
}

void expect_paddle_values(const torchamp::paddle::GradScaler& s, const std::string& how) {
  EXPECT_EQ(s.get_scale(), 384.0) << how;
  EXPECT_EQ(s.get_init_loss_scaling(), 384.0) << how;
  EXPECT_EQ(s.get_incr_ratio(), 3.0) << how;
  EXPECT_EQ(s.get_decr_ratio(), 0.25) << how;
  EXPECT_EQ(s.get_incr_every_n_steps(), 7) << how;
  EXPECT_EQ(s.get_decr_every_n_nan_or_inf(), 4) << how;
  EXPECT_EQ(s.get_incr_count(), 3) << how;
  EXPECT_EQ(s.get_decr_count(), 2) << how;
  EXPECT_FALSE(s.is_use_dynamic_loss_scaling()) << how;
}

// Same keys, same types, same values (tensors element for element).
void expect_same_dict(const StateDict& a, const StateDict& b, const std::string& how) {
  EXPECT_EQ(a.size(), b.size()) << how;
  for (const auto& kv : a) {
    auto it = b.find(kv.key());
    ASSERT_NE(it, b.end()) << how << ": missing " << kv.key().toStringRef();
    const c10::IValue& x = kv.value();
    const c10::IValue& y = it->value();
    EXPECT_EQ(x.tagKind(), y.tagKind()) << how << ": " << kv.key().toStringRef();
    if (x.isTensor() && y.isTensor()) {
      EXPECT_TRUE(torch::equal(x.toTensor(), y.toTensor()))
          << how << ": " << kv.key().toStringRef();
    } else {
      EXPECT_EQ(x, y) << how << ": " << kv.key().toStringRef();
    }
  }
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "torchamp_state_keys_" + name + ".pt";
}

TEST(StateKeys, EveryCoreKeyThroughEveryPath) {
  GradScaler a;
  a.load_state_dict(core_dict());
  expect_core_values(a, "load_state_dict");
  expect_same_dict(a.state_dict(), core_dict(), "state_dict");

  GradScaler b;
  b.load_state_dict(a.state_dict());
  expect_core_values(b, "state_dict -> load_state_dict");

  const std::string path = temp_path("core");
  torch::save(a, path);
  GradScaler c;
  torch::load(c, path);
  expect_core_values(c, "torch::save -> torch::load");
  std::remove(path.c_str());

  GradScaler d;
  d.load_state_dict(torch::pickle_load(torch::pickle_save(a.state_dict())).toGenericDict());
  expect_core_values(d, "torch::pickle_save -> torch::pickle_load");
}

// The report: torch::save/torch::load lost min_scale and
// max_consecutive_skips (and the skip count).
TEST(StateKeys, TorchSaveKeepsTheExtensionOptions) {
  GradScaler a(GradScalerOptions().min_scale(1.0).max_consecutive_skips(5));
  const std::string path = temp_path("extension");
  torch::save(a, path);
  GradScaler b;
  torch::load(b, path);
  std::remove(path.c_str());
  EXPECT_EQ(b.get_min_scale(), 1.0);
  EXPECT_EQ(b.get_max_consecutive_skips(), 5);
}

TEST(StateKeys, EveryPaddleKeyThroughEveryPathAndAcrossFacades) {
  torchamp::paddle::GradScaler a;
  a.load_state_dict(paddle_dict());
  expect_paddle_values(a, "paddle load_state_dict");
  expect_same_dict(a.state_dict(), paddle_dict(), "paddle state_dict");

  const std::string path = temp_path("paddle");
  torch::save(a, path);
  torchamp::paddle::GradScaler b;
  torch::load(b, path);
  expect_paddle_values(b, "paddle torch::save -> torch::load");

  torchamp::paddle::GradScaler c;
  c.load_state_dict(torch::pickle_load(torch::pickle_save(a.state_dict())).toGenericDict());
  expect_paddle_values(c, "paddle pickle");

  // Paddle's file into the core: Paddle's keys map onto the core's; the
  // three keys Paddle lacks keep the core's values.
  GradScaler core(GradScalerOptions().min_scale(2.0).max_consecutive_skips(6));
  torch::load(core, path);
  std::remove(path.c_str());
  EXPECT_EQ(core.get_scale(), 384.0);
  EXPECT_EQ(core.get_growth_factor(), 3.0);
  EXPECT_EQ(core.get_backoff_factor(), 0.25);
  EXPECT_EQ(core.get_growth_interval(), 7);
  EXPECT_EQ(core.get_growth_tracker(), 3);
  EXPECT_EQ(core.get_backoff_interval(), 4);
  EXPECT_EQ(core.get_backoff_tracker(), 2);
  EXPECT_FALSE(core.is_dynamic());
  EXPECT_EQ(core.get_min_scale(), 2.0);
  EXPECT_EQ(core.get_max_consecutive_skips(), 6);

  // And the core's dict into the facade, then back out in Paddle's schema.
  GradScaler full;
  full.load_state_dict(core_dict());
  torchamp::paddle::GradScaler d;
  d.load_state_dict(full.state_dict());
  expect_paddle_values(d, "core dict -> paddle");
  expect_same_dict(d.state_dict(), paddle_dict(), "core dict -> paddle -> paddle state_dict");
  EXPECT_EQ(d.core().get_min_scale(), 1.5);  // kept underneath, though Paddle has no key
}

// lucid.amp.GradScaler.state_dict() (the reference page's framework):
// {"scale": float, "growth_factor": float, "backoff_factor": float,
//  "growth_interval": int, "growth_tracker": int}, always these five.
StateDict lucid_dict() {
  StateDict d = dict();
  d.insert("scale", 384.0);
  d.insert("growth_factor", 3.0);
  d.insert("backoff_factor", 0.25);
  d.insert("growth_interval", int64_t{7});
  d.insert("growth_tracker", int64_t{3});
  return d;
}

TEST(StateKeys, ALucidCheckpointLoads) {
  GradScaler s(GradScalerOptions().backoff_interval(2).min_scale(0.5));
  s.load_state_dict(lucid_dict());
  EXPECT_EQ(s.get_scale(), 384.0);
  EXPECT_EQ(s.options().init_scale(), 384.0);
  EXPECT_EQ(s.get_growth_factor(), 3.0);
  EXPECT_EQ(s.get_backoff_factor(), 0.25);
  EXPECT_EQ(s.get_growth_interval(), 7);
  EXPECT_EQ(s.get_growth_tracker(), 3);
  EXPECT_EQ(s.get_backoff_interval(), 2);  // lucid has no such key: kept
  EXPECT_EQ(s.get_min_scale(), 0.5);

  // Through torch::load too: an archive holding lucid's keys.
  torch::serialize::OutputArchive archive;
  for (const auto& kv : lucid_dict()) {
    archive.write(kv.key().toStringRef(), kv.value());
  }
  const std::string path = temp_path("lucid");
  archive.save_to(path);
  GradScaler t;
  torch::load(t, path);
  std::remove(path.c_str());
  EXPECT_EQ(t.get_scale(), 384.0);
  EXPECT_EQ(t.get_growth_tracker(), 3);
  EXPECT_EQ(t.get_growth_interval(), 7);

  // And into the Paddle facade.
  torchamp::paddle::GradScaler p;
  p.load_state_dict(lucid_dict());
  EXPECT_EQ(p.get_incr_count(), 3);
  EXPECT_EQ(p.get_init_loss_scaling(), 384.0);
}

TEST(StateKeys, ALucidDictWithAMissingOrMistypedKeyOrMixedSchemasChangesNothing) {
  GradScaler s(GradScalerOptions().init_scale(64).growth_interval(11));
  const auto before = s.state_dict();
  auto missing = lucid_dict();
  (void)missing.erase("growth_interval");
  expect_throws<c10::ValueError>([&] { s.load_state_dict(missing); },
                                 "state_dict is missing the key 'growth_interval'");
  auto mistyped = lucid_dict();
  mistyped.insert_or_assign("growth_tracker", 2.5);
  expect_throws<c10::ValueError>([&] { s.load_state_dict(mistyped); },
                                 "state_dict['growth_tracker'] must be an int, got Double");
  auto mixed = lucid_dict();
  mixed.insert("_growth_tracker", int64_t{3});
  expect_throws<c10::ValueError>(
      [&] { s.load_state_dict(mixed); },
      "state_dict mixes PyTorch's schema (key '_growth_tracker') and lucid's (key "
      "'growth_tracker')");
  auto mixed_paddle = lucid_dict();
  mixed_paddle.insert("incr_count", int64_t{3});
  expect_throws<c10::ValueError>([&] { s.load_state_dict(mixed_paddle); },
                                 "state_dict mixes Paddle's schema (key 'incr_count') and lucid's");
  auto out_of_range = lucid_dict();
  out_of_range.insert_or_assign("backoff_factor", 1.5);
  expect_throws<c10::ValueError>([&] { s.load_state_dict(out_of_range); },
                                 "state_dict['backoff_factor'] must be in (0, 1)");
  expect_same_dict(s.state_dict(), before, "after the refused loads");
}

}  // namespace
