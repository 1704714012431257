#pragma once

// The scenarios of the DistributedDataParallel tests, one rank each (see
// tests/integration/distributed/test_data_parallel.cpp, which starts them as real processes over
// loopback Gloo, and tests/integration/python/ddp_parity.py, which runs ddp-train beside
// Python's own DistributedDataParallel). Ported from PyTorch's DDP tests
// (torch/testing/_internal/distributed/distributed_test.py, test_c10d_gloo.py)
// where they apply: a DDP model against a local model on the global batch,
// no_sync accumulation, unused parameters, BatchNorm buffers,
// gradient_as_bucket_view, several parameter groups.
//
// Scenarios (WORLD ranks split a global batch of 12 evenly):
//   ddp-train, ddp-train-view   5 SGD steps (two parameter groups, momentum),
//            1 KiB buckets; -view with gradient_as_bucket_view
//   ddp-local                   the same on one process, whole batch, no DDP
//   ddp-no-sync, ddp-no-sync-local  3 steps of 3 micro-batches, the first two
//            under no_sync
//   ddp-unused, ddp-unused-missing  a branch that never runs, with and
//            without find_unused_parameters
//   ddp-buffers, ddp-buffers-off    BatchNorm; broadcast_buffers on and off
//   ddp-amp, ddp-amp-local      GradScaler, float16 autocast (bfloat16 where
//            CPU autocast has no float16), summed gradients with the loss
//            weighted by the slice's share; an overflow in rank 1's slice
//   ddp-train-checkpoint, ddp-no-sync-checkpoint, ddp-amp-checkpoint  the same
//            with the model's first two modules checkpointed
//            (torchamp::checkpoint_sequential, 3 segments; the first on the
//            plain input); ddp-train-checkpoint-unused with
//            find_unused_parameters
//   ddp-train-reload, ddp-train-reload-unused  ddp-train with the model saved
//            and loaded back (torch::save, torch::load) after step 1; -unused
//            with find_unused_parameters
//   ddp-train-resume, ddp-train-resume-early, ddp-train-resume-fresh
//            ddp-train stopped after step 1 (-early: step 0, and the DDP
//            built before the load, as the apps do) and resumed as a
//            restarted process would: a new model, optimizer and DDP loaded
//            from what was saved, with the saved bucket_indices()
//            (set_bucket_indices); -fresh without them; -skew with rank 1
//            given other buckets (every rank takes rank 0's)
//   ddp-errors                  bad arguments (1 rank)
//   ddp-exit                    rank 1 exits in the middle of backward
// Every line of the output file is one observation; the test compares them.
#include <torchamp/checkpoint.h>
#include <torchamp/data_parallel.h>
#include <torchamp/torchamp.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

namespace torchamp_ddp {

using GroupFactory = std::function<c10::intrusive_ptr<c10d::ProcessGroup>()>;

constexpr int64_t kGlobalBatch = 12;

// Deterministic values that Python computes with the same ops (ddp_parity.py).
inline torch::Tensor wave(at::IntArrayRef shape, double freq, double phase, double amp) {
  int64_t n = 1;
  for (const int64_t s : shape) {
    n *= s;
  }
  return torch::arange(n, torch::kFloat).mul(freq).add(phase).sin().mul(amp).reshape(shape);
}

inline torch::nn::Sequential make_model() {
  torch::nn::Sequential m(torch::nn::Linear(16, 32), torch::nn::Tanh(), torch::nn::Linear(32, 32),
                          torch::nn::Tanh(), torch::nn::Linear(32, 4));
  torch::NoGradGuard no_grad;
  int i = 0;
  for (auto& p : m->parameters()) {
    p.copy_(wave(p.sizes(), 0.37 + 0.01 * i, 0.1 * i, 0.3));
    ++i;
  }
  return m;
}

inline std::pair<torch::Tensor, torch::Tensor> batch(int step, int rank, int world) {
  const auto x = wave({kGlobalBatch, 16}, 0.13, step, 1.0);
  const auto y = wave({kGlobalBatch, 4}, 0.07, 2.0 * step, 1.0);
  const int64_t per = kGlobalBatch / world;
  return {x.slice(0, rank * per, (rank + 1) * per), y.slice(0, rank * per, (rank + 1) * per)};
}

// SGD with momentum, the first layer in a group of its own (half the lr).
inline std::unique_ptr<torch::optim::SGD> make_sgd(torch::nn::Sequential& m) {
  const auto params = m->parameters();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>(params.begin(), params.begin() + 2),
      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.05).momentum(0.9)));
  groups.emplace_back(
      std::vector<torch::Tensor>(params.begin() + 2, params.end()),
      std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(0.1).momentum(0.9)));
  return std::make_unique<torch::optim::SGD>(std::move(groups),
                                             torch::optim::SGDOptions(0.1).momentum(0.9));
}

inline void print_params(torch::nn::Module& m, std::ofstream& out) {
  char buf[64];
  for (const auto& p : m.parameters()) {
    const auto flat = p.detach().flatten().contiguous();
    for (int64_t j = 0; j < flat.numel(); ++j) {
      std::snprintf(buf, sizeof buf, "param %.9g", static_cast<double>(flat[j].item<float>()));
      out << buf << "\n";
    }
  }
}

// Python's zero_grad(set_to_none=True): LibTorch 1.13's Optimizer::zero_grad
// zeroes in place after detach_(), which bucket views refuse.
inline void grads_to_none(torch::nn::Module& m) {
  for (auto& p : m.parameters()) {
    p.mutable_grad() = torch::Tensor();
  }
}

inline std::string first_line(const c10::Error& e) {
  std::string msg = e.what_without_backtrace();
  return msg.substr(0, msg.find('\n'));
}

// The model's forward, checkpointed or not (the -checkpoint scenarios).
inline torch::Tensor forward(torch::nn::Sequential& model, const torch::Tensor& x, bool ckpt) {
  return ckpt ? torchamp::checkpoint_sequential(model, 3, x) : model->forward(x);
}

// The DDP of a scenario's rank; none for its one-process reference.
inline std::unique_ptr<torchamp::DistributedDataParallel> wrap(
    bool local, torch::nn::Sequential& model, const GroupFactory& make_group,
    const torchamp::DistributedDataParallelOptions& options) {
  if (local) {
    return nullptr;
  }
  return std::make_unique<torchamp::DistributedDataParallel>(model.ptr(), make_group(), options);
}

// ddp-train, ddp-train-view, ddp-local; with `reload`, the model saved and
// loaded back after step 1 (torch::load `set_`s each parameter: new tensors
// with the same values, under the DDP built before).
inline int train(bool local, bool view, bool ckpt, bool find_unused, bool reload, int rank,
                 int world, const GroupFactory& make_group, std::ofstream& out) {
  auto model = make_model();
  auto opt = make_sgd(model);
  const auto ddp = wrap(local, model, make_group,
                        torchamp::DistributedDataParallelOptions()
                            .bucket_cap_mb(1.0 / 1024)
                            .gradient_as_bucket_view(view)
                            .find_unused_parameters(find_unused));
  for (int step = 0; step < 5; ++step) {
    if (reload && step == 2) {
      std::stringstream saved;
      torch::save(model, saved);
      torch::load(model, saved);
    }
    const auto [x, y] = batch(step, local ? 0 : rank, local ? 1 : world);
    grads_to_none(*model);
    const auto out_t = ddp ? ddp->forward([&, x = x] { return forward(model, x, ckpt); })
                           : forward(model, x, ckpt);
    torch::mse_loss(out_t, y).backward();
    opt->step();
    if (ddp && step == 0) {  // the buckets the next forward rebuilds
      for (const auto& b : ddp->bucket_indices()) {
        out << "predicted";
        for (const size_t i : b) {
          out << " " << i;
        }
        out << "\n";
      }
    }
  }
  print_params(*model, out);
  if (ddp) {
    out << "buckets " << ddp->bucket_indices().size() << "\n";
    for (const auto& b : ddp->bucket_indices()) {
      out << "bucket";
      for (const size_t i : b) {
        out << " " << i;
      }
      out << "\n";
    }
    if (view) {
      // The gradients are views of the buckets: the last two parameters share one.
      const auto p = model->parameters();
      out << "grads in one bucket " << p[p.size() - 1].grad().is_alias_of(p[p.size() - 2].grad())
          << "\n";
    }
  }
  return 0;
}

// ddp-train-resume(-early, -fresh): ddp-train's steps up to `saved_at`, the
// model, optimizer and buckets saved; then everything made anew (a restarted
// process), loaded, and the steps after it.
inline int train_resumed(int saved_at, bool ddp_first, bool buckets, bool skew, int rank, int world,
                         const GroupFactory& make_group, std::ofstream& out) {
  const auto options = torchamp::DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024);
  std::stringstream model_bytes, opt_bytes;
  std::vector<std::vector<size_t>> saved;
  auto steps = [&](torch::nn::Sequential& model, torch::optim::SGD& opt,
                   torchamp::DistributedDataParallel& ddp, int from, int to) {
    for (int step = from; step < to; ++step) {
      const auto [x, y] = batch(step, rank, world);
      grads_to_none(*model);
      torch::mse_loss(ddp.forward([&, x = x] { return model->forward(x); }), y).backward();
      opt.step();
    }
  };
  auto group = make_group();
  {
    auto model = make_model();
    auto opt = make_sgd(model);
    torchamp::DistributedDataParallel ddp(model.ptr(), group, options);
    steps(model, *opt, ddp, 0, saved_at + 1);
    torch::save(model, model_bytes);
    torch::save(*opt, opt_bytes);
    saved = ddp.bucket_indices();  // after step 0: the rebuild it is about to make
  }
  auto model = make_model();
  auto opt = make_sgd(model);
  std::optional<torchamp::DistributedDataParallel> ddp;
  if (ddp_first) {
    ddp.emplace(model.ptr(), group, options);
  }
  torch::load(model, model_bytes);
  torch::load(*opt, opt_bytes);
  if (!ddp_first) {
    ddp.emplace(model.ptr(), group, options);
  }
  if (skew && rank == 1) {
    saved = {{5, 4, 3, 2, 1, 0}};
  }
  if (buckets) {
    ddp->set_bucket_indices(saved);
  }
  steps(model, *opt, *ddp, saved_at + 1, 5);
  print_params(*model, out);
  return 0;
}

// ddp-no-sync, ddp-no-sync-local: gradients of three micro-batches summed.
inline int no_sync(bool local, bool ckpt, int rank, int world, const GroupFactory& make_group,
                   std::ofstream& out) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), 0.1);
  const auto ddp = wrap(local, model, make_group, {});
  auto micro = [&](int k) {
    const auto [x, y] = batch(k, local ? 0 : rank, local ? 1 : world);
    const auto o = ddp ? ddp->forward([&, x = x] { return forward(model, x, ckpt); })
                       : forward(model, x, ckpt);
    torch::mse_loss(o, y).backward();
  };
  char buf[96];
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    for (int k = 0; k < 3; ++k) {
      if (!ddp) {
        micro(3 * step + k);
        continue;
      }
      // Accumulation as a user writes it: no reduction but for the last micro-batch.
      auto guard = ddp->no_sync(k + 1 < 3);
      micro(3 * step + k);
      if (k == 1) {
        std::snprintf(buf, sizeof buf, "local grad sum %.9g sync %d",
                      model->parameters()[0].grad().sum().item<double>(),
                      static_cast<int>(ddp->require_backward_grad_sync()));
        out << buf << "\n";
      }
    }
    opt.step();
  }
  print_params(*model, out);
  return 0;
}

// A model whose second branch never runs.
struct Branchy : torch::nn::Module {
  Branchy() {
    used = register_module("used", torch::nn::Linear(16, 4));
    unused = register_module("unused", torch::nn::Linear(16, 4));
  }
  // Two outputs in a tuple (DDP finds the tensors in it), both from `used`.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    const auto h = used->forward(x);
    return {h, h.tanh()};
  }
  torch::nn::Linear used{nullptr}, unused{nullptr};
};

inline int unused(bool find, int rank, int world, const GroupFactory& make_group,
                  std::ofstream& out) {
  auto model = std::make_shared<Branchy>();
  torch::optim::SGD opt(model->parameters(), 0.1);
  torchamp::DistributedDataParallel ddp(
      model, make_group(), torchamp::DistributedDataParallelOptions().find_unused_parameters(find));
  for (int step = 0; step < 3; ++step) {
    const auto [x, y] = batch(step, rank, world);
    opt.zero_grad();
    try {
      const auto [a, b] = ddp.forward([&] { return model->forward(x); });
      (torch::mse_loss(a, y) + torch::mse_loss(b, y)).backward();
    } catch (const c10::Error& e) {
      out << "step " << step << " error " << first_line(e) << "\n";
      const std::string text = e.what_without_backtrace();
      out << "then c10d's text: "
          << (text.find("\nExpected to have finished reduction in the prior iteration") !=
              std::string::npos)
          << "\n";
      return 0;
    }
    opt.step();
    out << "step " << step << " ok unused grad defined " << model->unused->weight.grad().defined()
        << "\n";
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "used weight sum %.9g", model->used->weight.sum().item<double>());
  out << buf << "\n";
  return 0;
}

// ddp-errors (1 rank): bad arguments give typed errors naming the value, and
// change nothing (no collective ran: the model is as it was).
inline int errors(const GroupFactory& make_group, std::ofstream& out) {
  auto group = make_group();
  auto model = make_model();
  const auto before = model->parameters()[0].clone();
  auto attempt = [&](const char* what, const auto& construct) {
    try {
      construct();
      out << what << ": no error\n";
    } catch (const c10::ValueError& e) {
      out << what << ": ValueError " << first_line(e) << "\n";
    } catch (const c10::Error& e) {
      out << what << ": Error " << first_line(e) << "\n";
    }
  };
  using Options = torchamp::DistributedDataParallelOptions;
  attempt("null module",
          [&] { torchamp::DistributedDataParallel(std::shared_ptr<torch::nn::Module>(), group); });
  attempt("null group", [&] { torchamp::DistributedDataParallel(model.ptr(), {}); });
  attempt("bucket_cap_mb 0", [&] {
    torchamp::DistributedDataParallel(model.ptr(), group, Options().bucket_cap_mb(0));
  });
  attempt("bucket_cap_mb -2.5", [&] {
    torchamp::DistributedDataParallel(model.ptr(), group, Options().bucket_cap_mb(-2.5));
  });
  torch::nn::Linear frozen(2, 2);
  for (auto& p : frozen->parameters()) {
    p.requires_grad_(false);
  }
  attempt("no trainable parameter",
          [&] { torchamp::DistributedDataParallel(frozen.ptr(), group); });
  out << "unchanged " << model->parameters()[0].equal(before) << "\n";
  // A parameter loaded since construction (its hook lost) and then frozen
  // cannot be hooked again: an error naming it, the DDP as it was; unfrozen,
  // the next forward hooks it.
  torchamp::DistributedDataParallel ddp(model.ptr(), group);
  std::stringstream saved;
  torch::save(model, saved);
  torch::load(model, saved);
  model->parameters()[2].requires_grad_(false);
  const auto x = torch::ones({2, 16});
  attempt("frozen after a load", [&] { ddp.forward([&] { return model->forward(x); }); });
  model->parameters()[2].requires_grad_(true);
  torch::mse_loss(ddp.forward([&] { return model->forward(x); }), torch::zeros({2, 4})).backward();
  out << "then trains " << model->parameters()[2].grad().defined() << "\n";
  // set_bucket_indices: each of the 6 parameters once, a bucket one dtype.
  const auto layout = ddp.bucket_indices();
  using Buckets = std::vector<std::vector<size_t>>;
  attempt("index 6", [&] { ddp.set_bucket_indices(Buckets{{5, 4, 3, 2}, {1, 0, 6}}); });
  attempt("twice", [&] { ddp.set_bucket_indices(Buckets{{5, 4, 3, 2}, {2, 1, 0}}); });
  attempt("missing", [&] { ddp.set_bucket_indices(Buckets{{5, 4, 3, 2}, {1}}); });
  attempt("empty", [&] { ddp.set_bucket_indices(Buckets{{5, 4, 3, 2, 1, 0}, {}}); });
  torch::nn::Sequential mixed(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
  mixed[1]->to(torch::kDouble);
  torchamp::DistributedDataParallel mixed_ddp(mixed.ptr(), group);
  attempt("mixed", [&] { mixed_ddp.set_bucket_indices(Buckets{{3, 2, 1, 0}}); });
  out << "buckets unchanged " << (ddp.bucket_indices() == layout) << "\n";
  ddp.set_bucket_indices(Buckets{{0, 2, 4}, {5, 3, 1}});
  const auto o = ddp.forward([&] { return model->forward(x); });
  out << "then reduces in " << ddp.bucket_indices().size() << " buckets\n";
  torch::mse_loss(o, torch::zeros({2, 4})).backward();
  out << "and rebuilds into " << ddp.bucket_indices().size() << "\n";  // (cap: 25 MiB)
  // A layer moved to float64 (Module::to) after the buckets were made: a
  // Reducer remade over the old buckets would mix dtypes in one, so it gets
  // Python's assignment (by dtype) instead; buckets set by
  // set_bucket_indices that no longer fit are refused at the forward, and
  // stay until replaced.
  auto two_step = [&](torchamp::DistributedDataParallel& dd, torch::nn::Sequential& m) {
    grads_to_none(*m);  // (Module::to leaves a float gradient on a float64 parameter)
    auto* first = m[0]->as<torch::nn::Linear>();
    auto* second = m[1]->as<torch::nn::Linear>();
    const auto o = dd.forward([&] {
      return second->forward(first->forward(torch::ones({2, 2})).to(second->weight.dtype()));
    });
    torch::mse_loss(o, torch::zeros_like(o)).backward();
  };
  torch::nn::Sequential carried(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
  torchamp::DistributedDataParallel carried_ddp(carried.ptr(), group);
  two_step(carried_ddp, carried);
  two_step(carried_ddp, carried);  // rebuilt: one bucket
  carried[1]->to(torch::kDouble);
  two_step(carried_ddp, carried);
  out << "a layer moved: reduces in " << carried_ddp.bucket_indices().size() << " buckets\n";
  torch::nn::Sequential set(torch::nn::Linear(2, 2), torch::nn::Linear(2, 2));
  torchamp::DistributedDataParallel set_ddp(set.ptr(), group);
  set_ddp.set_bucket_indices(Buckets{{3, 2, 1, 0}});
  set[1]->to(torch::kDouble);
  attempt("set, then a layer moved", [&] { two_step(set_ddp, set); });
  set_ddp.set_bucket_indices(Buckets{{3, 2}, {1, 0}});
  two_step(set_ddp, set);
  out << "set again: reduces in " << set_ddp.bucket_indices().size() << " buckets\n";
  return 0;
}

// BatchNorm: its running statistics as every rank sees them at the start of
// each forward (inside the call, after DDP's broadcast).
inline int buffers(bool broadcast, int rank, int world, const GroupFactory& make_group,
                   std::ofstream& out) {
  torch::manual_seed(rank);  // different initial weights: construction takes rank 0's
  torch::nn::Sequential model(torch::nn::Linear(16, 8), torch::nn::BatchNorm1d(8),
                              torch::nn::Linear(8, 4));
  torch::optim::SGD opt(model->parameters(), 0.1);
  torchamp::DistributedDataParallel ddp(
      model.ptr(), make_group(),
      torchamp::DistributedDataParallelOptions().broadcast_buffers(broadcast));
  char buf[96];
  std::snprintf(buf, sizeof buf, "initial weight sum %.9g",
                model->parameters()[0].sum().item<double>());
  out << buf << "\n";
  auto* bn = model[1]->as<torch::nn::BatchNorm1d>();
  for (int step = 0; step < 3; ++step) {
    const auto [x, y] = batch(step, rank, world);
    opt.zero_grad();
    const auto o = ddp.forward([&, x = x] {
      std::snprintf(buf, sizeof buf, "step %d running_mean %.9g running_var %.9g", step,
                    bn->running_mean.sum().item<double>(), bn->running_var.sum().item<double>());
      out << buf << "\n";
      return model->forward(x);
    });
    torch::mse_loss(o, y).backward();
    opt.step();
  }
  return 0;
}

// ddp-amp, ddp-amp-local: the scaler over summed gradients, each rank's loss
// weighted by its share; step 2's and step 5's batches hold an overflow in the
// sample that is rank 1's (on one process: the same sample).
inline int amp(bool local, bool ckpt, int rank, int world, const GroupFactory& make_group,
               std::ofstream& out) {
  auto model = make_model();
  auto opt = make_sgd(model);
  const auto ddp = wrap(local, model, make_group,
                        torchamp::DistributedDataParallelOptions().average_gradients(false));
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(1024).growth_interval(2));
  const auto dtype =
      torchamp::autocast::is_supported(torch::kCPU, torch::kHalf) ? torch::kHalf : torch::kBFloat16;
  const int ranks = local ? 1 : world;
  const int64_t per = kGlobalBatch / ranks;
  for (int step = 0; step < 8; ++step) {
    auto x = wave({kGlobalBatch, 16}, 0.13, step, 1.0);
    const auto y = wave({kGlobalBatch, 4}, 0.07, 2.0 * step, 1.0);
    if (step == 2 || step == 5) {
      x[7][3] = std::numeric_limits<float>::infinity();  // in rank 1's slice on 2 and on 3 ranks
    }
    const int r = local ? 0 : rank;
    const auto xs = x.slice(0, r * per, (r + 1) * per), ys = y.slice(0, r * per, (r + 1) * per);
    opt->zero_grad();
    torch::Tensor loss;
    {
      torchamp::autocast guard(torch::kCPU, dtype);
      const auto o =
          ddp ? ddp->forward([&] { return forward(model, xs, ckpt); }) : forward(model, xs, ckpt);
      loss = torch::mse_loss(o.to(torch::kFloat), ys);
    }
    const double share = static_cast<double>(per) / kGlobalBatch;
    scaler.scale(loss * share).backward();
    const bool stepped = scaler.step(*opt).has_value();
    scaler.update();
    out << "step " << step << " stepped " << stepped << " scale " << scaler.get_scale() << "\n";
  }
  print_params(*model, out);
  return 0;
}

// ddp-exit: rank 1 dies while its backward runs (after the last layer's
// gradients, before the first's); rank 0's backward fails, naming the
// all-reduce, within the group's timeout.
inline int exit_mid_backward(int rank, int world, const GroupFactory& make_group,
                             std::ofstream& out) {
  auto model = make_model();
  torchamp::DistributedDataParallel ddp(
      model.ptr(), make_group(),
      torchamp::DistributedDataParallelOptions().bucket_cap_mb(1.0 / 1024));
  for (int step = 0; step < 3; ++step) {
    const auto [x, y] = batch(step, rank, world);
    model->zero_grad();
    auto o = ddp.forward([&, x = x] {
      auto h = model[0]->as<torch::nn::Linear>()->forward(x);
      if (rank == 1 && step == 2) {
        h.register_hook([&out](torch::Tensor g) {
          out.flush();
          std::_Exit(0);
          return g;
        });
      }
      h = model[2]->as<torch::nn::Linear>()->forward(torch::tanh(h));
      return model[4]->as<torch::nn::Linear>()->forward(torch::tanh(h));
    });
    const auto start = std::chrono::steady_clock::now();
    try {
      torch::mse_loss(o, y).backward();
      out << "step " << step << " ok\n";
    } catch (const c10::Error& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      out << "error after_ms " << ms << "\n";
      out << "message " << first_line(e) << "\n";
      return 0;
    }
  }
  return 0;
}

/// Runs a DDP scenario; -1 where `scenario` is not one.
inline int run(const std::string& scenario, int rank, int world, const GroupFactory& make_group,
               std::ofstream& out) {
  if (scenario == "ddp-train" || scenario == "ddp-train-view" || scenario == "ddp-local" ||
      scenario.rfind("ddp-train-checkpoint", 0) == 0 ||
      scenario.rfind("ddp-train-reload", 0) == 0) {
    const bool unused = scenario.size() > 7 && scenario.substr(scenario.size() - 7) == "-unused";
    return train(scenario == "ddp-local", scenario == "ddp-train-view",
                 scenario.rfind("ddp-train-checkpoint", 0) == 0, unused,
                 scenario.rfind("ddp-train-reload", 0) == 0, rank, world, make_group, out);
  }
  if (scenario.rfind("ddp-train-resume", 0) == 0) {
    const bool early = scenario == "ddp-train-resume-early";
    return train_resumed(early ? 0 : 1, early, scenario != "ddp-train-resume-fresh",
                         scenario == "ddp-train-resume-skew", rank, world, make_group, out);
  }
  if (scenario == "ddp-no-sync" || scenario == "ddp-no-sync-local" ||
      scenario == "ddp-no-sync-checkpoint") {
    return no_sync(scenario == "ddp-no-sync-local", scenario == "ddp-no-sync-checkpoint", rank,
                   world, make_group, out);
  }
  if (scenario == "ddp-unused" || scenario == "ddp-unused-missing") {
    return unused(scenario == "ddp-unused", rank, world, make_group, out);
  }
  if (scenario == "ddp-buffers" || scenario == "ddp-buffers-off") {
    return buffers(scenario == "ddp-buffers", rank, world, make_group, out);
  }
  if (scenario == "ddp-amp" || scenario == "ddp-amp-local" || scenario == "ddp-amp-checkpoint") {
    return amp(scenario == "ddp-amp-local", scenario == "ddp-amp-checkpoint", rank, world,
               make_group, out);
  }
  if (scenario == "ddp-errors") {
    return errors(make_group, out);
  }
  if (scenario == "ddp-exit") {
    return exit_mid_backward(rank, world, make_group, out);
  }
  return -1;
}

}  // namespace torchamp_ddp
