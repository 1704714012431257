// Model-based random testing of torchamp::GradScaler.
//
// A deliberately simple reference model, written from the specification (the
// reference page, PyTorch's GradScaler, the core issue), runs side by side with
// the real scaler over random call sequences: 1-3 optimizers, each one of
// LibTorch's SGD (lr 1, so a step is p -= g) or AdamW, or torchamp's fused
// SGD, Adam or AdamW (whose step through the scaler only checks the gradients;
// the update divides them by the scale and writes them back divided, as
// Python's fused optimizers; a skipped step leaves them scaled), gradients with
// random inf/NaN, unscale_/step/update in any order, update(new_scale),
// setters with good and bad values, state-dict round trips through pickle
// into a fresh scaler, random options. After every call it compares the error
// (none, or its type and message), the scale, both trackers, the skip
// counter, every gradient bit for bit, and every parameter: SGD's bit for
// bit; Adam's and AdamW's against the model's own LibTorch optimizer, stepped
// exactly when the specification says and with the gradients it says
// (unscaled, in float32), within float32 rounding, and their step counts
// exactly (a skipped step must not count).
//
// TORCHAMP_MODEL_SEQUENCES (default 1500: a few seconds) sets how many
// sequences run; TORCHAMP_MODEL_SEED the first seed. A failure prints the seed
// and the shortest failing sequence found by deleting calls one at a time.
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include "compat/compat.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torchamp::GradScaler;
using torchamp::GradScalerOptions;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---- the calls ---------------------------------------------------------------

enum class Kind {
  kSetGrads,
  kUnscale,
  kStep,
  kUpdate,
  kUpdateNewScale,
  kSetGrowthFactor,
  kSetBackoffFactor,
  kSetGrowthInterval,
  kSetBackoffInterval,
  kSaveLoad
};

struct Call {
  Kind kind;
  int opt = 0;
  double value = 0;                       // new scale, factor or interval
  std::vector<std::vector<float>> grads;  // kSetGrads: per parameter; empty = no gradient
};

std::string to_string(const Call& c) {
  std::ostringstream s;
  switch (c.kind) {
    case Kind::kSetGrads:
      s << "set_grads(opt " << c.opt << ":";
      for (const auto& g : c.grads) {
        s << " [";
        for (size_t i = 0; i < g.size(); ++i) {
          s << (i ? " " : "") << g[i];
        }
        s << "]";
      }
      s << ")";
      break;
    case Kind::kUnscale:
      s << "unscale_(opt " << c.opt << ")";
      break;
    case Kind::kStep:
      s << "step(opt " << c.opt << ")";
      break;
    case Kind::kUpdate:
      s << "update()";
      break;
    case Kind::kUpdateNewScale:
      s << "update(" << c.value << ")";
      break;
    case Kind::kSetGrowthFactor:
      s << "set_growth_factor(" << c.value << ")";
      break;
    case Kind::kSetBackoffFactor:
      s << "set_backoff_factor(" << c.value << ")";
      break;
    case Kind::kSetGrowthInterval:
      s << "set_growth_interval(" << c.value << ")";
      break;
    case Kind::kSetBackoffInterval:
      s << "set_backoff_interval(" << c.value << ")";
      break;
    case Kind::kSaveLoad:
      s << "state_dict -> pickle -> load into a fresh scaler";
      break;
  }
  return s.str();
}

// The optimizers: LibTorch's own or torchamp's fused ones.
enum class OptKind { kSgd, kFusedSgd, kAdamW, kFusedAdam, kFusedAdamW };

const char* name(OptKind k) {
  switch (k) {
    case OptKind::kSgd:
      return "SGD";
    case OptKind::kFusedSgd:
      return "fused SGD";
    case OptKind::kAdamW:
      return "AdamW";
    case OptKind::kFusedAdam:
      return "fused Adam";
    case OptKind::kFusedAdamW:
      return "fused AdamW";
  }
  return "?";
}

bool is_fused(OptKind k) {
  return k == OptKind::kFusedSgd || k == OptKind::kFusedAdam || k == OptKind::kFusedAdamW;
}

bool is_adam(OptKind k) {
  return k == OptKind::kAdamW || k == OptKind::kFusedAdam || k == OptKind::kFusedAdamW;
}

struct OptSpec {
  OptKind kind = OptKind::kSgd;
  bool amsgrad = false;  // Adam, AdamW
  double weight_decay = 0;
};

// Adam(W) options of a spec: lr 0.1 so that every step moves the parameters.
template <class Options>
Options adam_options(const OptSpec& spec) {
  return Options(0.1).amsgrad(spec.amsgrad).weight_decay(spec.weight_decay);
}

// A real optimizer of the spec's kind; `reference`: LibTorch's own of the
// same arithmetic (the model's oracle for Adam and AdamW).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptSpec& spec,
                                                        const std::vector<torch::Tensor>& ps,
                                                        bool reference = false) {
  const OptKind k = reference && spec.kind == OptKind::kFusedAdamW ? OptKind::kAdamW : spec.kind;
  switch (k) {
    case OptKind::kSgd:
      return std::make_unique<torch::optim::SGD>(ps, 1.0);
    case OptKind::kFusedSgd:
      return std::make_unique<torchamp::optim::SGD>(ps, 1.0);
    case OptKind::kAdamW:
      return std::make_unique<torch::optim::AdamW>(ps,
                                                   adam_options<torch::optim::AdamWOptions>(spec));
    case OptKind::kFusedAdam:
      if (reference) {
        return std::make_unique<torch::optim::Adam>(ps,
                                                    adam_options<torch::optim::AdamOptions>(spec));
      }
      return std::make_unique<torchamp::optim::Adam>(ps,
                                                     adam_options<torch::optim::AdamOptions>(spec));
    case OptKind::kFusedAdamW:
      return std::make_unique<torchamp::optim::AdamW>(
          ps, adam_options<torch::optim::AdamWOptions>(spec));
  }
  return nullptr;
}

// The step count of each parameter's Adam(W) state; -1: no state yet.
std::vector<int64_t> adam_steps(const torch::optim::Optimizer& opt) {
  std::vector<int64_t> steps;
  const auto& state = opt.state();
  for (const auto& p : opt.param_groups().at(0).params()) {
    auto it = state.find(torchamp::compat::optim_state_key(state, p));
    if (it == state.end()) {
      steps.push_back(-1);
    } else if (auto* w = dynamic_cast<const torch::optim::AdamWParamState*>(it->second.get())) {
      steps.push_back(w->step());
    } else {
      steps.push_back(static_cast<const torch::optim::AdamParamState&>(*it->second).step());
    }
  }
  return steps;
}

struct Scenario {
  GradScalerOptions options;
  std::vector<int> params_per_opt;  // each parameter has 3 elements
  std::vector<OptSpec> specs;       // per optimizer
  std::vector<Call> calls;
};

// ---- the reference model -------------------------------------------------------

enum class Err { kNone, kRuntime, kValue, kNotImplemented };

struct Expect {
  Err err = Err::kNone;
  std::string needle;
};

struct Model {
  enum Stage { kReady, kUnscaled, kStepped };
  struct Opt {
    Stage stage = kReady;
    bool checked = false;
    bool found = false;
    bool deferred = false;  // fused: gradients left scaled, divided inside the update
  };
  bool enabled, dynamic;
  float scale;
  double gf, bf, min_scale;
  int64_t gi, bi, gt = 0, bt = 0, max_skips, skips = 0;
  std::map<int, Opt> opts;
  // params[o][p] and grads[o][p] (grads: nullopt = undefined)
  std::vector<std::vector<std::vector<float>>> params;
  std::vector<std::vector<std::optional<std::vector<float>>>> grads;
  std::vector<OptSpec> specs;
  // Adam(W): the reference optimizer and its parameters (`params` unused)
  std::vector<std::vector<torch::Tensor>> ref_params;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> ref_opts;

  explicit Model(const Scenario& sc)
      : enabled(sc.options.enabled()),
        dynamic(sc.options.dynamic()),
        scale(static_cast<float>(sc.options.init_scale())),
        gf(sc.options.growth_factor()),
        bf(sc.options.backoff_factor()),
        min_scale(sc.options.min_scale()),
        gi(sc.options.growth_interval()),
        bi(sc.options.backoff_interval()),
        max_skips(sc.options.max_consecutive_skips()),
        specs(sc.specs) {
    for (size_t o = 0; o < sc.params_per_opt.size(); ++o) {
      const int n = sc.params_per_opt[o];
      params.emplace_back(n, std::vector<float>(3, 0.0f));
      grads.emplace_back(n);
      ref_params.emplace_back();
      for (int i = 0; i < n; ++i) {
        ref_params.back().push_back(torch::zeros({3}));
      }
      ref_opts.push_back(is_adam(specs[o].kind)
                             ? make_optimizer(specs[o], ref_params.back(), /*reference=*/true)
                             : nullptr);
    }
  }

  static bool finite(float v) { return std::isfinite(v); }

  float inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(scale)); }

  // unscale the optimizer's gradients (or, `deferred`, only check them);
  // returns false when it has none.
  bool unscale(int o, bool deferred = false) {
    const float inv = inv_scale();
    bool any = false, found = false;
    for (auto& g : grads[o]) {
      if (!g) {
        continue;
      }
      any = true;
      for (float& v : *g) {
        found = found || !finite(v);
        if (!deferred) {
          v = v * inv;
        }
      }
    }
    if (any) {
      opts[o] = {kUnscaled, true, found, deferred};
    }
    return any;
  }

  Expect apply(const Call& c) {
    switch (c.kind) {
      case Kind::kSetGrads:
        for (size_t p = 0; p < grads[c.opt].size(); ++p) {
          if (c.grads[p].empty()) {
            grads[c.opt][p].reset();
          } else {
            grads[c.opt][p] = c.grads[p];
          }
        }
        return {};
      case Kind::kUnscale: {
        if (!enabled) {
          return {};
        }
        const Stage st = opts.count(c.opt) ? opts[c.opt].stage : kReady;
        if (st == kUnscaled) {
          return {Err::kRuntime, "unscale_() has already been called on this optimizer"};
        }
        if (st == kStepped) {
          return {Err::kRuntime, "unscale_() is being called after step()."};
        }
        if (!unscale(c.opt)) {
          opts[c.opt] = {kUnscaled, false, false};
        }
        return {};
      }
      case Kind::kStep: {
        if (!enabled) {
          optimizer_step(c.opt);
          return {};
        }
        const Stage st = opts.count(c.opt) ? opts[c.opt].stage : kReady;
        if (st == kStepped) {
          return {Err::kRuntime, "step() has already been called since the last update()."};
        }
        if (st == kReady && !unscale(c.opt, /*deferred=*/is_fused(specs[c.opt].kind))) {
          return {Err::kRuntime, "No inf checks were recorded for this optimizer."};
        }
        Opt& o = opts[c.opt];
        if (!o.checked) {
          return {Err::kRuntime, "No inf checks were recorded for this optimizer."};
        }
        if (o.found) {
          if (max_skips > 0 && skips + 1 >= max_skips) {
            return {Err::kRuntime, "steps in a row were skipped"};
          }
          ++skips;
        } else {
          optimizer_step(c.opt, o.deferred ? std::optional<float>(scale) : std::nullopt);
        }
        o.stage = kStepped;
        return {};
      }
      case Kind::kUpdate: {
        if (!enabled) {
          return {};
        }
        bool checked = false, found = false;
        for (const auto& kv : opts) {
          checked = checked || kv.second.checked;
          found = found || (kv.second.checked && kv.second.found);
        }
        if (!checked) {
          return {Err::kRuntime, "No inf checks were recorded prior to update."};
        }
        if (dynamic) {
          schedule(found);
        }
        if (!found) {
          skips = 0;
        }
        opts.clear();
        return {};
      }
      case Kind::kUpdateNewScale: {
        if (!enabled) {
          return {};
        }
        const auto f = static_cast<float>(c.value);
        if (!(c.value > 0) || !std::isfinite(c.value) || !std::isfinite(f) || f <= 0) {
          return {Err::kValue, "scale must be"};
        }
        scale = f;
        opts.clear();
        return {};
      }
      case Kind::kSetGrowthFactor:
        if (!(c.value > 1.0) || !std::isfinite(c.value)) {
          return {Err::kValue, "growth_factor must be a finite number > 1.0"};
        }
        gf = c.value;
        return {};
      case Kind::kSetBackoffFactor:
        if (!(c.value > 0.0 && c.value < 1.0)) {
          return {Err::kValue, "backoff_factor must be in (0, 1)"};
        }
        bf = c.value;
        return {};
      case Kind::kSetGrowthInterval:
        if (c.value < 1) {
          return {Err::kValue, "growth_interval must be >= 1"};
        }
        gi = static_cast<int64_t>(c.value);
        return {};
      case Kind::kSetBackoffInterval:
        if (c.value < 1) {
          return {Err::kValue, "backoff_interval must be >= 1"};
        }
        bi = static_cast<int64_t>(c.value);
        return {};
      case Kind::kSaveLoad:
        opts.clear();  // a fresh scaler: every optimizer ready
        return {};
    }
    return {};
  }

  // SGD: lr 1, p -= g; Adam(W): the reference optimizer's step. `grad_scale`:
  // the fused update's unscale, g / scale in float32, written back to the
  // gradient as ATen's fused ops do.
  void optimizer_step(int o, std::optional<float> grad_scale = std::nullopt) {
    if (grad_scale) {
      for (auto& g : grads[o]) {
        if (g) {
          for (float& v : *g) {
            v = v / *grad_scale;
          }
        }
      }
    }
    if (ref_opts[o]) {
      for (size_t p = 0; p < grads[o].size(); ++p) {
        if (!grads[o][p]) {
          ref_params[o][p].mutable_grad() = torch::Tensor();
          continue;
        }
        std::vector<float> g(3);
        for (size_t i = 0; i < 3; ++i) {
          g[i] = (*grads[o][p])[i];
        }
        ref_params[o][p].mutable_grad() = torch::from_blob(g.data(), {3}).clone();
      }
      ref_opts[o]->step();
      return;
    }
    for (size_t p = 0; p < params[o].size(); ++p) {
      if (grads[o][p]) {
        for (size_t i = 0; i < 3; ++i) {
          params[o][p][i] = params[o][p][i] - (*grads[o][p])[i];
        }
      }
    }
  }

  // The schedule, from the specification: consecutive overflowing updates
  // back off after bi, consecutive clean ones grow after gi (unless the result
  // is not a finite float32), each kind resetting the other's counter.
  void schedule(bool found) {
    if (found) {
      gt = 0;
      if (++bt >= bi) {
        const auto next = static_cast<float>(static_cast<double>(scale) * bf);
        if (static_cast<double>(next) >= min_scale) {
          scale = next;
        } else if (static_cast<double>(scale) > min_scale) {
          scale = static_cast<float>(min_scale);
        }
        bt = 0;
      }
    } else {
      bt = 0;
      if (++gt >= gi) {
        const auto next = static_cast<float>(static_cast<double>(scale) * gf);
        if (std::isfinite(next)) {
          scale = next;
        }
        gt = 0;
      }
    }
  }
};

// ---- running a scenario against the real scaler ---------------------------------

// Parameters: bit for bit, except that any NaN equals any NaN (SGD's own
// arithmetic may propagate a different NaN payload than the model's p - g).
bool same_values(const float* a, const float* b) {
  for (int i = 0; i < 3; ++i) {
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i]))) {
      return false;
    }
  }
  return true;
}

// Adam(W), fused against LibTorch's: equal within float32 rounding (NaN
// where the other has NaN, the same infinities).
bool close_values(const float* a, const float* b) {
  for (int i = 0; i < 3; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i]) || std::isinf(a[i]) || std::isinf(b[i])) {
      if (std::memcmp(a + i, b + i, sizeof(float)) != 0 &&
          !(std::isnan(a[i]) && std::isnan(b[i]))) {
        return false;
      }
    } else if (std::fabs(a[i] - b[i]) > 1e-6 + 1e-5 * std::fabs(b[i])) {
      return false;
    }
  }
  return true;
}

std::optional<std::string> run(const Scenario& sc) {
  auto scaler = std::make_unique<GradScaler>(sc.options);
  Model model(sc);
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  for (size_t o = 0; o < sc.params_per_opt.size(); ++o) {
    std::vector<torch::Tensor> ps;
    for (int i = 0; i < sc.params_per_opt[o]; ++i) {
      ps.push_back(torch::zeros({3}, torch::requires_grad()));
    }
    params.push_back(ps);
    opts.push_back(make_optimizer(sc.specs[o], ps));
  }
  for (size_t k = 0; k < sc.calls.size(); ++k) {
    const Call& c = sc.calls[k];
    const Expect expect = model.apply(c);
    Err got = Err::kNone;
    std::string message;
    try {
      switch (c.kind) {
        case Kind::kSetGrads:
          for (size_t p = 0; p < c.grads.size(); ++p) {
            params[c.opt][p].mutable_grad() =
                c.grads[p].empty()
                    ? torch::Tensor()
                    : torch::from_blob(const_cast<float*>(c.grads[p].data()), {3}).clone();
          }
          break;
        case Kind::kUnscale:
          scaler->unscale_(*opts[c.opt]);
          break;
        case Kind::kStep:
          scaler->step(*opts[c.opt]);
          break;
        case Kind::kUpdate:
          scaler->update();
          break;
        case Kind::kUpdateNewScale:
          scaler->update(c.value);
          break;
        case Kind::kSetGrowthFactor:
          scaler->set_growth_factor(c.value);
          break;
        case Kind::kSetBackoffFactor:
          scaler->set_backoff_factor(c.value);
          break;
        case Kind::kSetGrowthInterval:
          scaler->set_growth_interval(static_cast<int64_t>(c.value));
          break;
        case Kind::kSetBackoffInterval:
          scaler->set_backoff_interval(static_cast<int64_t>(c.value));
          break;
        case Kind::kSaveLoad:
          if (sc.options.enabled()) {
            const auto bytes = torch::pickle_save(scaler->state_dict());
            auto fresh = std::make_unique<GradScaler>();
            fresh->load_state_dict(torch::pickle_load(bytes).toGenericDict());
            scaler = std::move(fresh);
          }
          break;
      }
    } catch (const c10::ValueError& e) {
      got = Err::kValue;
      message = e.what_without_backtrace();
    } catch (const c10::NotImplementedError& e) {
      got = Err::kNotImplemented;
      message = e.what_without_backtrace();
    } catch (const c10::Error& e) {
      got = Err::kRuntime;
      message = e.what_without_backtrace();
    }
    std::ostringstream why;
    if (got != expect.err) {
      why << "error kind " << static_cast<int>(got) << " (" << message << "), model expects "
          << static_cast<int>(expect.err) << " (" << expect.needle << ")";
    } else if (got != Err::kNone && message.find(expect.needle) == std::string::npos) {
      why << "message '" << message << "' lacks '" << expect.needle << "'";
    } else if (scaler->get_scale() != (model.enabled ? static_cast<double>(model.scale) : 1.0)) {
      why << "scale " << scaler->get_scale() << ", model " << model.scale;
    } else if (model.enabled && (scaler->get_growth_tracker() != model.gt ||
                                 scaler->get_backoff_tracker() != model.bt ||
                                 scaler->get_consecutive_skips() != model.skips)) {
      why << "trackers " << scaler->get_growth_tracker() << "/" << scaler->get_backoff_tracker()
          << "/" << scaler->get_consecutive_skips() << ", model " << model.gt << "/" << model.bt
          << "/" << model.skips;
    } else {
      for (size_t o = 0; o < params.size() && why.str().empty(); ++o) {
        for (size_t p = 0; p < params[o].size(); ++p) {
          const auto& g = params[o][p].grad();
          const auto& mg = model.grads[o][p];
          if (g.defined() != mg.has_value() ||
              (mg && std::memcmp(g.data_ptr<float>(), mg->data(), 12) != 0)) {
            why << "gradient of opt " << o << " param " << p << " differs";
            break;
          }
          const bool adam = model.ref_opts[o] != nullptr;
          if (adam ? !close_values(params[o][p].data_ptr<float>(),
                                   model.ref_params[o][p].data_ptr<float>())
                   : !same_values(params[o][p].data_ptr<float>(), model.params[o][p].data())) {
            why << "parameter " << o << "/" << p << " differs: " << params[o][p];
            break;
          }
        }
        if (why.str().empty() && model.ref_opts[o] &&
            adam_steps(*opts[o]) != adam_steps(*model.ref_opts[o])) {
          why << "step counts of opt " << o << " differ";
        }
      }
    }
    if (!why.str().empty()) {
      return "after call " + std::to_string(k) + " " + to_string(c) + ": " + why.str();
    }
  }
  return std::nullopt;
}

// ---- generating scenarios ------------------------------------------------------------

Scenario generate(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](auto... xs) {
    const std::vector<std::common_type_t<decltype(xs)...>> v = {xs...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  Scenario sc;
  sc.options.enabled(!chance(0.1))
      .dynamic(!chance(0.15))
      .init_scale(std::ldexp(1.0, pick(0, 1, 4, 10, 16, 24, 126)))
      .growth_factor(pick(2.0, 4.0, 1.5, 1e10))
      .backoff_factor(pick(0.5, 0.25, 0.75))
      .growth_interval(pick(1, 2, 3, 5))
      .backoff_interval(pick(1, 1, 2, 3))
      .min_scale(pick(0.0, 0.0, 1.0, 64.0))
      .max_consecutive_skips(pick(0, 0, 2, 3, 6));
  const int n_opts = pick(1, 1, 2, 3);
  for (int o = 0; o < n_opts; ++o) {
    sc.params_per_opt.push_back(pick(1, 2, 3));
    OptSpec spec;
    spec.kind = pick(OptKind::kSgd, OptKind::kFusedSgd, OptKind::kFusedSgd, OptKind::kAdamW,
                     OptKind::kFusedAdam, OptKind::kFusedAdamW);
    spec.amsgrad = chance(0.5);
    spec.weight_decay = pick(0.0, 0.01);
    sc.specs.push_back(spec);
  }
  const int n_calls = std::uniform_int_distribution<int>(5, 40)(rng);
  for (int k = 0; k < n_calls; ++k) {
    Call c;
    c.opt = std::uniform_int_distribution<int>(0, n_opts - 1)(rng);
    const int r = std::uniform_int_distribution<int>(0, 99)(rng);
    if (r < 30) {
      c.kind = Kind::kSetGrads;
      for (int p = 0; p < sc.params_per_opt[c.opt]; ++p) {
        std::vector<float> g;
        if (!chance(0.1)) {
          for (int i = 0; i < 3; ++i) {
            g.push_back(static_cast<float>(pick(-3, -1, 1, 2, 5)) *
                        std::ldexp(1.0f, pick(0, 4, 10, 20)));
          }
          if (chance(0.25)) {
            g[std::uniform_int_distribution<int>(0, 2)(rng)] = pick(kInf, -kInf, kNaN);
          }
        }
        c.grads.push_back(g);
      }
    } else if (r < 50) {
      c.kind = Kind::kStep;
    } else if (r < 62) {
      c.kind = Kind::kUnscale;
    } else if (r < 82) {
      c.kind = Kind::kUpdate;
    } else if (r < 86) {
      c.kind = Kind::kUpdateNewScale;
      c.value = pick(1.0, 8.0, 0.5, 1024.0, -1.0, 0.0, 1e39, std::nan(""));
    } else if (r < 88) {
      c.kind = Kind::kSetGrowthFactor;
      c.value = pick(2.0, 3.0, 1.0, 0.5);
    } else if (r < 90) {
      c.kind = Kind::kSetBackoffFactor;
      c.value = pick(0.5, 0.125, 1.0, 0.0);
    } else if (r < 92) {
      c.kind = Kind::kSetGrowthInterval;
      c.value = pick(1, 2, 4, 0, -1);
    } else if (r < 94) {
      c.kind = Kind::kSetBackoffInterval;
      c.value = pick(1, 2, 3, 0);
    } else {
      c.kind = Kind::kSaveLoad;
    }
    sc.calls.push_back(c);
  }
  return sc;
}

// Deletes calls one at a time while the scenario still fails.
Scenario shrink(Scenario sc) {
  bool progress = true;
  while (progress) {
    progress = false;
    for (size_t k = 0; k < sc.calls.size(); ++k) {
      Scenario smaller = sc;
      smaller.calls.erase(smaller.calls.begin() + static_cast<std::ptrdiff_t>(k));
      if (run(smaller)) {
        sc = std::move(smaller);
        progress = true;
        break;
      }
    }
  }
  return sc;
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

TEST(ModelBased, RandomCallSequencesMatchTheReferenceModel) {
  const int64_t sequences = env_int("TORCHAMP_MODEL_SEQUENCES", 1500);
  const auto first = static_cast<uint64_t>(env_int("TORCHAMP_MODEL_SEED", 1));
  int64_t calls = 0;
  for (int64_t i = 0; i < sequences; ++i) {
    const uint64_t seed = first + static_cast<uint64_t>(i);
    const Scenario sc = generate(seed);
    calls += static_cast<int64_t>(sc.calls.size());
    if (auto failure = run(sc)) {
      const Scenario small = shrink(sc);
      std::ostringstream report;
      report << "seed " << seed << " (rerun: TORCHAMP_MODEL_SEED=" << seed
             << " TORCHAMP_MODEL_SEQUENCES=1): " << *failure << "\noptions: enabled "
             << sc.options.enabled() << " dynamic " << sc.options.dynamic() << " init_scale "
             << sc.options.init_scale() << " growth " << sc.options.growth_factor() << "/"
             << sc.options.growth_interval() << " backoff " << sc.options.backoff_factor() << "/"
             << sc.options.backoff_interval() << " min_scale " << sc.options.min_scale()
             << " max_consecutive_skips " << sc.options.max_consecutive_skips() << " optimizers:" <<
          [&] {
            std::string f;
            for (const OptSpec& spec : sc.specs) {
              f += std::string(" ") + name(spec.kind) + (spec.amsgrad ? " amsgrad" : "") +
                   (spec.weight_decay != 0 ? " wd" : "");
            }
            return f;
          }() << "\nshortest failing sequence ("
             << small.calls.size() << " calls): " << run(small).value_or("") << "\n";
      for (const Call& c : small.calls) {
        report << "  " << to_string(c) << "\n";
      }
      FAIL() << report.str();
    }
  }
  std::cout << "[ model    ] " << sequences << " sequences, " << calls
            << " calls checked against the reference model\n";
}

}  // namespace
