#include "train.h"

#include <torchamp/autocast.h>
#include <torchamp/config.h>
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>
#include "launch.h"
#include "step_graph.h"
#include "step_profiler.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <tuple>

namespace torchamp_gpt {

namespace {

using torchamp_apps::g17;
using torchamp_apps::Options;

// nanoGPT's schedule: a linear warmup to `lr`, then a cosine down to
// `min_lr` at the last step (gpt_python.py computes the same doubles).
double lr_at(const Config& c, int64_t step) {
  if (step < c.warmup) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup + 1);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, c.steps - c.warmup));
  const double ratio = std::min(1.0, static_cast<double>(step - c.warmup) / span);
  const double pi = 3.14159265358979323846;
  return c.min_lr + 0.5 * (1.0 + std::cos(pi * ratio)) * (c.lr - c.min_lr);
}

// The seed of a micro-batch's dropout masks: the same micro-batch (by its
// index in the global batch) draws the same masks on any number of ranks.
uint64_t dropout_seed(const Config& c, int64_t step, int64_t micro) {
  return c.seed * 1000003u + static_cast<uint64_t>(step) * 1009u + static_cast<uint64_t>(micro);
}

std::string fnv1a(const std::vector<at::Tensor>& tensors) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& t : tensors) {
    const auto c = t.detach().cpu().contiguous();
    const auto* p = static_cast<const uint8_t*>(c.data_ptr());
    for (size_t i = 0; i < c.nbytes(); ++i) {
      h = (h ^ p[i]) * 1099511628211ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// nanoGPT's groups: weight decay on the matrices (embeddings and Linear
// weights), none on biases and LayerNorms.
torchamp::optim::AdamW make_optimizer(GPT& model, const Config& c, const Mode& mode) {
  std::vector<at::Tensor> decay, rest;
  for (const auto& p : model->parameters()) {
    (p.dim() >= 2 ? decay : rest).push_back(p);
  }
  auto options = [&](double wd) {
    return torch::optim::AdamWOptions(c.lr)
        .betas(std::make_tuple(0.9, 0.95))
        .eps(1e-8)
        .weight_decay(wd);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options(c.weight_decay)));
  groups.emplace_back(rest, std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
  return torchamp::optim::AdamW(std::move(groups), options(c.weight_decay),
                                torchamp::optim::FusedOptions()
                                    .master_weights(mode.masters)
                                    .stochastic_rounding(mode.stochastic)
                                    .aten_kernels(c.device_step));
}

// One mode's training state: the model, its optimizer and scaler, and, on
// more than one process, its DistributedDataParallel.
struct Trainer {
  const Corpus& corpus;
  const Config& c;
  const Mode& mode;
  const Runtime& rt;
  GPT model;
  torchamp::optim::AdamW opt;
  torchamp::GradScaler scaler;
  torchamp_apps::DataParallel ddp;

  Trainer(const Corpus& corpus_, const Config& c_, const Mode& mode_, const Runtime& rt_)
      : corpus(corpus_),
        c(c_),
        mode(mode_),
        rt(rt_),
        model(initial_model(c_, std::max(c_.vocab, corpus_.vocab_size()))),
        opt((model->to(mode_.device, mode_.params), make_optimizer(model, c_, mode_))),
        scaler(torchamp::GradScalerOptions()
                   .init_scale(c_.init_scale)
                   .growth_interval(c_.growth_interval)
                   .enabled(mode_.scaler)
                   .device_state(c_.device_step)) {}

  // Data-parallel from here on. Before a resume's load, which gives the DDP
  // the checkpoint's buckets (the DDP hooks the loaded parameters at its
  // first forward).
  void distribute() {
    // Summed, not averaged: each rank's loss is already weighted by its
    // share (micro_step), so a rank's float16 activation gradients are the
    // size of the one-process run's and overflow where they do.
    ddp = torchamp_apps::DataParallel(model.ptr(), rt.group);
  }

  at::Tensor logits(const at::Tensor& x) {
    std::optional<torchamp::autocast> guard;
    if (mode.autocast) {  // no weight cache under a CUDA graph (as Python's recipe)
      guard.emplace(mode.device, *mode.autocast, true, !mode.graph);
    }
    return ddp.forward([&] { return model->forward(x); }, model->is_training());
  }

  // The mean cross-entropy of the next characters `y` after `x` (on the device).
  at::Tensor loss_on(const at::Tensor& x, const at::Tensor& y) {
    const auto out = logits(x);
    return at::cross_entropy_loss(out.to(at::kFloat).view({-1, out.size(-1)}), y.view({-1}));
  }

  at::Tensor loss_of(const at::Tensor& split, const std::vector<int64_t>& starts) {
    auto [x, y] = batch(split, starts, c.model.context);
    return loss_on(x.to(mode.device), y.to(mode.device));
  }

  // This rank's micro-batch m, by its index in the global batch (what its
  // data and its dropout masks are drawn by, on any number of ranks).
  int64_t micro_index(int64_t m) const { return m * c.world + rt.rank; }

  // Where micro-batch m of `step` starts in the training split on this rank.
  std::vector<int64_t> train_starts(int64_t step, int64_t m) const {
    return offsets(c.seed, 0, step, micro_index(m) * c.batch_size, c.batch_size,
                   corpus.train.size(0), c.model.context);
  }

  // One micro-batch's forward and backward; its loss, unscaled and weighted
  // by its share of the global batch (1 / (accum x world)).
  double micro_step(int64_t step, int64_t m) {
    torch::manual_seed(dropout_seed(c, step, micro_index(m)));
    const auto no_sync = ddp.no_sync(m + 1 < c.accum);  // these gradients stay local
    const auto loss =
        loss_of(corpus.train, train_starts(step, m)) / static_cast<double>(c.accum * c.world);
    scaler.scale(loss).backward();
    return loss.item<double>();
  }

  double global_sum(double local) { return ddp.sum(local); }

  // CUDA modes without dropout take a step with no host read (device_step),
  // which --cuda-graph captures: its micro-batches in fixed tensors on the
  // device, its rate in the optimizer's lr tensors, its loss left there.
  // --device-step (no dropout: checked) takes it on the CPU too.
  bool on_device() const {
    return (mode.device == c10::DeviceType::CUDA || c.device_step) && c.model.dropout == 0;
  }
  at::Tensor xs, ys, step_loss, one;
  std::vector<at::Tensor> lrs;

  void feed(int64_t step, double lr) {
    if (!xs.defined()) {
      const auto ids = at::TensorOptions().dtype(at::kLong).device(mode.device);
      xs = at::empty({c.accum, c.batch_size, c.model.context}, ids);
      ys = at::empty_like(xs);
      one = at::ones({}, at::TensorOptions().device(mode.device));
      for (size_t g = 0; g < opt.param_groups().size(); ++g) {
        lrs.push_back(opt.lr_tensor(g));
      }
    }
    for (int64_t m = 0; m < c.accum; ++m) {
      const auto [x, y] = batch(corpus.train, train_starts(step, m), c.model.context);
      xs[m].copy_(x);
      ys[m].copy_(y);
    }
    for (auto& rate : lrs) {
      rate.fill_(lr);
    }
  }

  void device_step() {
    at::Tensor total;
    for (int64_t m = 0; m < c.accum; ++m) {
      const auto no_sync = ddp.no_sync(m + 1 < c.accum);
      const auto loss = loss_on(xs[m], ys[m]) / static_cast<double>(c.accum * c.world);
      scaler.scale(loss).backward();
      total = m == 0 ? loss.detach() : total + loss.detach();
    }
    scaler.clip_grad_norm_tensor_(opt, c.clip);  // the norm stays on the device
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
    step_loss = total;
  }

  double validate() {
    torch::NoGradGuard no_grad;
    model->eval();
    double sum = 0;
    for (int64_t e = 0; e < c.eval_batches; ++e) {
      const auto starts = offsets(c.seed, 1, 0, e * c.batch_size, c.batch_size, corpus.val.size(0),
                                  c.model.context);
      sum += loss_of(corpus.val, starts).item<double>();
    }
    model->train();
    return sum / static_cast<double>(c.eval_batches);
  }

  std::string sample(int64_t n) {
    torch::manual_seed(c.seed);
    model->eval();
    std::optional<torchamp::autocast> guard;
    if (mode.autocast) {
      guard.emplace(mode.device, *mode.autocast);
    }
    const auto ids = model->generate(corpus.encode("\n").to(mode.device), n, 0.8);
    guard.reset();
    model->train();
    return corpus.decode(ids.slice(1, 1));
  }

  // What a checkpoint holds, for both its save and its load.
  torchamp_apps::RunState state() {
    torchamp_apps::RunState s;
    s.model(*model).optimizer(opt).scaler(scaler).data_parallel(ddp);
    return s;
  }
};

// What a step reports: this rank's summed loss, whether the step was taken,
// and the scale after it.
struct StepOutcome {
  double loss;
  bool stepped;
  double scale;
};

// One optimizer step at `lr`: the micro-batches, the unscaled gradients
// clipped, the scaler's step and update.
StepOutcome optimizer_step(Trainer& t, const Config& c, int64_t step, double lr,
                           const std::vector<at::Tensor>& params) {
  torchamp_apps::set_lr(t.opt, lr);
  double loss = 0;
  for (int64_t m = 0; m < c.accum; ++m) {
    loss += t.micro_step(step, m);
  }
  t.scaler.unscale_(t.opt);  // the real gradients, to clip them
  torch::nn::utils::clip_grad_norm_(params, c.clip);
  const bool stepped = t.scaler.step(t.opt).has_value();
  t.scaler.update();
  t.opt.zero_grad();
  return {loss, stepped, t.mode.scaler ? t.scaler.get_scale() : 1.0};
}

// The step on the device (Trainer::device_step), eager or replayed, and one
// read back of its loss and scale. A skipped step is one whose scale fell
// (PyTorch's rule, which this program's scalers follow, backs off at every
// overflow).
StepOutcome device_optimizer_step(Trainer& t, StepGraph& graph, int64_t step, double lr,
                                  double scale_before) {
  t.feed(step, lr);
  graph.run([&] { t.device_step(); });
  const auto read = at::stack({t.step_loss.to(at::kFloat), t.scaler.scale(t.one)}).cpu();
  const auto* v = read.data_ptr<float>();
  return {static_cast<double>(v[0]), !(v[1] < scale_before), static_cast<double>(v[1])};
}

}  // namespace

const std::vector<Mode>& known_modes() {
  using c10::DeviceType;
  static const std::vector<Mode> modes = {
      {"fp32", DeviceType::CPU, std::nullopt, at::kFloat, false, false, false,
       "float32 throughout"},
      {"bf16", DeviceType::CPU, at::kBFloat16, at::kFloat, false, false, false,
       "bfloat16 autocast, float32 parameters"},
      {"bf16-params", DeviceType::CPU, std::nullopt, at::kBFloat16, false, true, false,
       "bfloat16 parameters, float32 master weights in the fused AdamW"},
      {"bf16-sr", DeviceType::CPU, std::nullopt, at::kBFloat16, false, false, true,
       "bfloat16 parameters and AdamW state, stochastic rounding (no masters)"},
      {"bf16-nearest", DeviceType::CPU, std::nullopt, at::kBFloat16, false, false, false,
       "bfloat16 parameters and AdamW state, round to nearest (what the other two buy; not a "
       "default)",
       false},
      {"fp16+scaler", DeviceType::CPU, at::kHalf, at::kFloat, true, false, false,
       "float16 autocast (LibTorch >= 2.2), GradScaler"},
      {"cuda-fp16+scaler", DeviceType::CUDA, at::kHalf, at::kFloat, true, false, false,
       "CUDA float16 autocast, GradScaler"},
      {"cuda-bf16", DeviceType::CUDA, at::kBFloat16, at::kFloat, false, false, false,
       "CUDA bfloat16 autocast"},
      {"cuda-fp16+scaler+graph", DeviceType::CUDA, at::kHalf, at::kFloat, true, false, false,
       "cuda-fp16+scaler with its step captured in a CUDA graph (--cuda-graph)", false, true},
      {"cuda-bf16+graph", DeviceType::CUDA, at::kBFloat16, at::kFloat, false, false, false,
       "cuda-bf16 with its step captured in a CUDA graph (--cuda-graph)", false, true},
  };
  return modes;
}

bool mode_available(const Mode& mode) {
  if (mode.device == c10::DeviceType::CUDA && !torch::cuda::is_available()) {
    return false;
  }
  return !mode.autocast || torchamp::autocast::is_supported(mode.device, *mode.autocast);
}

const Mode& find_mode(const std::string& name) {
  return torchamp_apps::find_named(known_modes(), name, "mode");
}

std::vector<std::string> default_modes() {
  return torchamp_apps::names_where(
      known_modes(), [](const Mode& m) { return m.by_default && mode_available(m); });
}

std::vector<std::string> with_graph_modes(const std::vector<std::string>& modes) {
  std::vector<std::string> out;
  bool any = false;
  for (const auto& name : modes) {
    const Mode& m = find_mode(name);
    out.push_back(name);
    if (m.device == c10::DeviceType::CUDA && !m.graph) {
      any = true;
      const std::string twin = name + "+graph";
      if (std::find(modes.begin(), modes.end(), twin) == modes.end()) {
        out.push_back(find_mode(twin).name);
      }
    }
  }
  if (!any) {
    throw std::invalid_argument("--cuda-graph: --modes names no CUDA mode to capture");
  }
  return out;
}

Options Config::to_options() const {
  std::string mode_list;
  for (const auto& m : modes) {
    mode_list += (mode_list.empty() ? "" : ",") + m;
  }
  Options o{{"layers", std::to_string(model.layers)},
            {"heads", std::to_string(model.heads)},
            {"d_model", std::to_string(model.d_model)},
            {"context", std::to_string(model.context)},
            {"dropout", g17(model.dropout)},
            {"checkpoint_layers", model.checkpoint_layers ? "1" : "0"},
            {"vocab", std::to_string(vocab)},
            {"batch_size", std::to_string(batch_size)},
            {"accum", std::to_string(accum)},
            {"steps", std::to_string(steps)},
            {"warmup", std::to_string(warmup)},
            {"eval_every", std::to_string(eval_every)},
            {"eval_batches", std::to_string(eval_batches)},
            {"lr", g17(lr)},
            {"min_lr", g17(min_lr)},
            {"weight_decay", g17(weight_decay)},
            {"clip", g17(clip)},
            {"init_scale", g17(init_scale)},
            {"growth_interval", std::to_string(growth_interval)},
            {"seed", std::to_string(seed)},
            {"data", data},
            {"modes", mode_list},
            {"deterministic", deterministic ? "1" : "0"},
            {"world", std::to_string(world)}};
  if (device_step) {  // only where set: a folder from before the option continues
    o.emplace("device_step", "1");
  }
  return o;
}

std::optional<std::string> device_step_unsupported() {
  try {  // the optimizer --device-step makes, on one parameter
    const std::vector<at::Tensor> p{at::zeros({1}).requires_grad_()};
    torchamp::optim::AdamW(p, torch::optim::AdamWOptions(),
                           torchamp::optim::FusedOptions().aten_kernels(true));
    return std::nullopt;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
}

GPT initial_model(const Config& config, int64_t vocab) {
  torch::manual_seed(config.seed);
  GPTConfig g = config.model;
  g.vocab = vocab;
  return GPT(g);
}

void save_initial(const std::string& path, const Config& config, int64_t vocab) {
  torchamp_apps::write_pickle(path, torchamp_apps::parameters_dict(*initial_model(config, vocab)));
}

ModeResult train_mode(const Corpus& corpus, const Config& c, int64_t mode_index, const Runtime& rt,
                      const std::string& resume) {
  const Mode& mode = find_mode(c.modes.at(static_cast<size_t>(mode_index)));
  torchamp_apps::reset_peak_rss();
  const double start_rss = torchamp_apps::rss_mb();
  Trainer t(corpus, c, mode, rt);
  t.distribute();
  const int64_t start = t.state().resume(resume, mode_index);
  StepGraph graph(mode.graph);  // (a side stream from here while it captures)
  double scale = mode.scaler ? t.scaler.get_scale() : 1.0;
  ModeResult r;
  r.mode = mode.name;
  double seconds = 0, first_seconds = 0, last_loss = std::numeric_limits<double>::quiet_NaN();
  int64_t timed = 0, untimed = 0;
  const auto params = t.model->parameters();
  // --profile's steps: the last ones, on rank 0 (a run resumed inside them
  // profiles those left).
  const int64_t profile_from =
      rt.rank == 0 && rt.profile_steps > 0 ? c.steps - rt.profile_steps : c.steps;
  std::optional<StepProfiler> profiler;
  for (int64_t step = start; step < c.steps; ++step) {
    const double lr = lr_at(c, step);
    if (step >= profile_from && !profiler) {
      profiler.emplace(mode.device == c10::DeviceType::CUDA);
    }
    // Timed: the steps after this process's first, and in a captured mode
    // those after the capture (its eager warm-up and the capture are not).
    // Those profiled count in neither sum (the fallback below included).
    const bool profiled = profiler.has_value();
    const bool warm = step > start && (!mode.graph || graph.captured()) && !profiled;
    const auto t0 = std::chrono::steady_clock::now();
    auto take_step = [&] {
      return t.on_device() ? device_optimizer_step(t, graph, step, lr, scale)
                           : optimizer_step(t, c, step, lr, params);
    };
    const StepOutcome out = profiler ? profiler->step(take_step) : take_step();
    scale = out.scale;
    const double dt = torchamp_apps::seconds_since(t0);
    if (!profiled) {
      (warm ? seconds : first_seconds) += dt;
      ++(warm ? timed : untimed);
    }
    last_loss = t.global_sum(out.loss);
    StepRow row{mode.name, step,
                last_loss, std::numeric_limits<double>::quiet_NaN(),
                out.scale, out.stepped ? 0 : 1,
                lr,        torchamp_apps::seconds_since(t0)};
    if (profiled && step + 1 == c.steps) {  // the trace: before the last evaluation
      profiler->save(rt.trace_dir + "/trace-" + mode.name + ".json");
      profiler.reset();
    }
    if ((step + 1) % c.eval_every == 0 || step + 1 == c.steps) {
      row.val_loss = t.validate();
    }
    rt.after_step(row, mode_index, step + 1, c.steps, [&](const Position& p) {
      if (rt.rank == 0) {
        t.state().save(rt.checkpoint_path, p);
      }
    });
    r.val_loss = row.val_loss;
  }
  // Time per step and tokens/s over the timed steps (not the first:
  // oneDNN's kernel set-up and the allocator's first touch, as gpt_python.py
  // measures); the others where none was timed.
  if (timed < 1) {
    timed = untimed;
    seconds = first_seconds;
  }
  r.train_loss = last_loss;
  r.final_scale = mode.scaler ? t.scaler.get_scale() : 1.0;
  r.step_ms = timed > 0 ? 1e3 * seconds / static_cast<double>(timed) : 0.0;
  r.tokens_per_s =
      seconds > 0
          ? static_cast<double>(timed * c.batch_size * c.accum * c.world * c.model.context) /
                seconds
          : 0.0;
  r.peak_rss_mb = torchamp_apps::peak_rss_mb();
  r.start_rss_mb = start_rss;
  r.bytes_per_param = torchamp_apps::bytes_per_param(t.opt, params);
  for (const auto& p : params) {
    r.params += p.numel();
  }
  r.weights = fnv1a(params);
  if (rt.rank == 0 && rt.sample_chars > 0) {
    r.sample = t.sample(rt.sample_chars);
  }
  return r;
}

}  // namespace torchamp_gpt
