#pragma once

// The scenarios of the distributed scaler tests, one rank each (see
// tests/integration/distributed/test_distributed.cpp, which starts several as real processes over
// loopback). The process group comes from the caller: dist_worker.cpp forms
// it with torchamp::init_process_group.
//
// Scenarios:
//   agree    3 steps; rank 1 (if any) writes inf into a gradient at step 1
//   clean    3 steps, no inf anywhere
//   agree-fused  agree with torchamp's fused AdamW (deferred unscale): also
//            prints each parameter's AdamW step count
//   sharded  ZeRO-style: gradients averaged over ranks, each rank owns (and
//            steps) every WORLD-th parameter, owners broadcast them after the
//            step; inf on rank 1's own shard at steps 2 and 5
//   single   the sharded schedule in one process on the whole batch (WORLD 1,
//            no process group): the reference for sharded
//   sharded-fused, single-fused  the same with torchamp's fused SGD
//   exit     rank 1 exits at step 1 before stepping; rank 0 reports the error
//   new-group  torchamp::new_group over every rank and over the first and
//            last, each summing rank + 1
// Every line of the output file is one observation; the test compares them.
#include "ddp_scenarios.h"

#include <torchamp/distributed.h>
#include <torchamp/optim.h>
#include <torchamp/process_group.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <string>

namespace torchamp_dist {

using GroupFactory = std::function<c10::intrusive_ptr<c10d::ProcessGroup>()>;

inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline void wait(const c10::intrusive_ptr<c10d::Work>& work) {
  work->wait();
}

inline std::string state_line(const torchamp::GradScaler& s) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "scale %.9g growth %lld backoff %lld", s.get_scale(),
                static_cast<long long>(s.get_growth_tracker()),
                static_cast<long long>(s.get_backoff_tracker()));
  return buf;
}

// agree / clean: each rank has its own data, so its own gradients.
inline int agree(const std::string& scenario, int rank, int /*world*/,
                 const GroupFactory& make_group, std::ofstream& out) {
  auto group = make_group();
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  const bool fused = scenario == "agree-fused";
  std::unique_ptr<torch::optim::Optimizer> opt_ptr;
  if (fused) {
    opt_ptr = std::make_unique<torchamp::optim::AdamW>(model->parameters(), 0.01);
  } else {
    opt_ptr = std::make_unique<torch::optim::SGD>(model->parameters(), 0.1);
  }
  torch::optim::Optimizer& opt = *opt_ptr;
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(256).growth_interval(1));
  torchamp::set_process_group(scaler, group);
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 * rank + step);
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(torch::randn({8, 4})), torch::randn({8, 2})))
        .backward();
    if (scenario != "clean" && rank == 1 && step == 1) {
      model->weight.mutable_grad()[0][0] = kInf;
    }
    const bool stepped = scaler.step(opt).has_value();
    scaler.update();
    out << "step " << step << " stepped " << stepped << " " << state_line(scaler) << "\n";
  }
  if (fused) {
    for (const auto& kv : opt.state()) {
      out << "adamw steps " << static_cast<const torch::optim::AdamWParamState&>(*kv.second).step()
          << "\n";
    }
  }
  return 0;
}

// sharded and its single-process reference.
inline int sharded(bool single, bool fused, int rank, int world, const GroupFactory& make_group,
                   std::ofstream& out) {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  if (!single) {
    group = make_group();
  }
  const int ranks = single ? 2 : world;  // the global batch is split this way
  torch::manual_seed(7);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 4));
  const auto params = model->parameters();
  std::vector<torch::Tensor> owned;
  for (size_t i = 0; i < params.size(); ++i) {
    if (single || static_cast<int>(i) % world == rank) {
      owned.push_back(params[i]);
    }
  }
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  std::unique_ptr<torch::optim::Optimizer> opt_ptr;
  if (fused) {
    opt_ptr = std::make_unique<torchamp::optim::SGD>(owned, options);
  } else {
    opt_ptr = std::make_unique<torch::optim::SGD>(owned, options);
  }
  torch::optim::Optimizer& opt = *opt_ptr;
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(1024).growth_interval(3));
  if (group) {
    torchamp::set_process_group(scaler, group);
  }
  const auto target = torch::randn({16, 4});
  const int64_t per_rank = 8;
  for (int step = 0; step < 8; ++step) {
    torch::manual_seed(1000 + step);
    const auto x = torch::randn({per_rank * ranks, 16});
    const auto y = x.mm(target).argmax(1);
    opt.zero_grad();
    for (const auto& p : params) {
      p.mutable_grad() = torch::Tensor();
    }
    if (single) {
      scaler.scale(torch::nn::functional::cross_entropy(model->forward(x), y)).backward();
    } else {
      const auto xs = x.slice(0, rank * per_rank, (rank + 1) * per_rank);
      const auto ys = y.slice(0, rank * per_rank, (rank + 1) * per_rank);
      scaler.scale(torch::nn::functional::cross_entropy(model->forward(xs), ys)).backward();
      // Average the gradients; each rank keeps its own shard's (reduce-scatter).
      for (size_t i = 0; i < params.size(); ++i) {
        std::vector<torch::Tensor> g = {params[i].grad()};
        wait(group->allreduce(g));
        if (static_cast<int>(i) % world == rank) {
          params[i].mutable_grad().div_(world);
        } else {
          params[i].mutable_grad() = torch::Tensor();
        }
      }
    }
    // An overflow only in rank 1's shard (parameter 1 is rank 1's for 2 ranks).
    if ((step == 2 || step == 5) && (single || rank == 1)) {
      params[1].mutable_grad()[0] = kInf;
    }
    const bool stepped = scaler.step(opt).has_value();
    scaler.update();
    out << "step " << step << " stepped " << stepped << " " << state_line(scaler) << "\n";
    if (!single) {
      // All-gather the updated parameters from their owners.
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        std::vector<torch::Tensor> t = {params[i]};
        c10d::BroadcastOptions bo;
        bo.rootRank = static_cast<int>(i) % world;
        wait(group->broadcast(t, bo));
      }
    }
  }
  out.precision(9);
  for (const auto& p : params) {
    const auto flat = p.detach().flatten();
    for (int64_t j = 0; j < flat.numel(); ++j) {
      out << "param " << flat[j].item<float>() << "\n";
    }
  }
  return 0;
}

inline int exit_mid_step(int rank, int /*world*/, const GroupFactory& make_group,
                         std::ofstream& out) {
  auto group = make_group();
  torch::manual_seed(0);
  torch::nn::Linear model(4, 2);
  torch::optim::SGD opt(model->parameters(), 0.1);
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(256).growth_interval(1));
  torchamp::set_process_group(scaler, group, std::chrono::milliseconds(3000));
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(torch::ones({2, 4})), torch::zeros({2, 2})))
        .backward();
    if (step == 1 && rank == 1) {
      out.flush();
      std::_Exit(0);  // gone without a word, mid-step
    }
    const auto before = state_line(scaler);
    const auto grad_before = model->weight.grad().clone();
    const auto start = std::chrono::steady_clock::now();
    try {
      scaler.step(opt);
      scaler.update();
      out << "step " << step << " ok " << state_line(scaler) << "\n";
    } catch (const c10::Error& e) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
      std::string msg = e.what_without_backtrace();
      msg = msg.substr(0, msg.find('\n'));
      out << "error after_ms " << ms << "\n";
      out << "message " << msg << "\n";
      out << "unchanged " << (state_line(scaler) == before) << " "
          << model->weight.grad().equal(grad_before) << "\n";
      return 0;
    }
  }
  return 0;
}

// new-group: groups beside the default one, as Python's dist.new_group.
inline int new_groups(int rank, int world, const GroupFactory& make_group, std::ofstream& out) {
  auto whole = make_group();
  auto sum = [&](const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
    std::vector<at::Tensor> t = {torch::full({1}, rank + 1.0)};
    group->allreduce(t)->wait();
    return t[0].item<double>();
  };
  auto all = torchamp::new_group();
  auto ends = torchamp::new_group(torchamp::NewGroupOptions().ranks({world - 1, 0}));
  out << "default " << whole->getRank() << " of " << whole->getSize() << " sum " << sum(whole)
      << "\n";
  out << "all " << all->getRank() << " of " << all->getSize() << " sum " << sum(all) << "\n";
  if (ends) {
    out << "ends " << ends->getRank() << " of " << ends->getSize() << " sum " << sum(ends) << "\n";
  } else {
    out << "ends none\n";
  }
  return 0;
}

/// Runs SCENARIO as rank RANK of WORLD, writing observations to OUT_PATH; the
/// process group comes from `make_group` (torchamp::init_process_group in
/// dist_worker), at most once. Returns the process exit code.
inline int run_scenario(const std::string& scenario, int rank, int world,
                        const GroupFactory& make_group, const std::string& out_path) {
  std::ofstream out(out_path);
  try {
    if (scenario == "agree" || scenario == "clean" || scenario == "agree-fused") {
      return agree(scenario, rank, world, make_group, out);
    }
    if (scenario == "sharded" || scenario == "single" || scenario == "sharded-fused" ||
        scenario == "single-fused") {
      const bool single = scenario.rfind("single", 0) == 0;
      const bool fused = scenario.find("-fused") != std::string::npos;
      return sharded(single, fused, rank, world, make_group, out);
    }
    if (scenario == "exit") {
      return exit_mid_step(rank, world, make_group, out);
    }
    if (scenario == "new-group") {
      return new_groups(rank, world, make_group, out);
    }
    if (const int code = torchamp_ddp::run(scenario, rank, world, make_group, out); code >= 0) {
      return code;
    }
  } catch (const std::exception& e) {
    out << "uncaught " << e.what() << "\n";
    return 1;
  }
  std::cerr << "unknown scenario " << scenario << "\n";
  return 2;
}

}  // namespace torchamp_dist
