// bench_ddp: a data-parallel training step on 2 ranks (processes, Gloo over
// loopback), three ways, interleaved round by round in one run:
//
//   compute  forward, backward and SGD step with no communication at all:
//            the ceiling, what a step costs if communication were free;
//   after    backward, then every gradient all-reduced after it (flat 25 MB
//            buckets, all in flight, then waited for): the by-hand way
//            (torchamp-train's data-parallel mode before it used DDP);
//   ddp      torchamp::DistributedDataParallel: c10d's Reducer all-reduces
//            each 25 MB bucket (1 MB first) as soon as backward fills it.
//
// Each step starts with both ranks lined up (a one-element all-reduce), and
// rank 0 times it. Reports the median of each, their ratios, and the
// backward's share.
//
//   bench_ddp [--rounds N] [--batch B] [--width W] [--layers L] [--threads T]
//             [--bucket-cap-mb MB]   (defaults 15, 32, 512, 8, 1, DDP's default)
//
// Run without RANK it starts its two ranks itself (FileStore in /tmp).
#include <torchamp/data_parallel.h>
#include <torchamp/process_group.h>

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Args {
  int rounds = 15, batch = 32, width = 512, layers = 8, threads = 1;
  double bucket_cap_mb = 0;  // 0: DDP's default (25, first bucket 1)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--rounds") {
      a.rounds = v;
    } else if (k == "--batch") {
      a.batch = v;
    } else if (k == "--width") {
      a.width = v;
    } else if (k == "--layers") {
      a.layers = v;
    } else if (k == "--threads") {
      a.threads = v;
    } else if (k == "--bucket-cap-mb") {
      a.bucket_cap_mb = std::atof(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

using Clock = std::chrono::steady_clock;

torch::nn::Sequential make_model(const Args& a) {
  torch::manual_seed(0);
  torch::nn::Sequential m;
  for (int l = 0; l < a.layers; ++l) {
    m->push_back(torch::nn::Linear(a.width, a.width));
    m->push_back(torch::nn::ReLU());
  }
  return m;
}

void all_reduce_after_backward(c10d::ProcessGroup& group, torch::nn::Module& model) {
  // Flat buckets of at most 25 MB, all in flight, then copied back.
  constexpr int64_t kBucket = 25 * 1024 * 1024 / 4;
  std::vector<std::vector<at::Tensor>> buckets(1);
  int64_t filled = 0;
  for (const auto& p : model.parameters()) {
    if (filled > 0 && filled + p.numel() > kBucket) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(p.grad());
    filled += p.numel();
  }
  std::vector<std::vector<at::Tensor>> flat;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (const auto& b : buckets) {
    std::vector<at::Tensor> parts;
    for (const auto& g : b) {
      parts.push_back(g.reshape({-1}));
    }
    flat.push_back({at::cat(parts)});
    works.push_back(group.allreduce(flat.back()));
  }
  for (size_t i = 0; i < buckets.size(); ++i) {
    works[i]->wait();
    int64_t offset = 0;
    for (const auto& g : buckets[i]) {
      g.copy_(flat[i][0].narrow(0, offset, g.numel()).view(g.sizes()));
      offset += g.numel();
    }
  }
}

int rank_main(const Args& a, int rank, const std::string& store_file) {
  at::set_num_threads(a.threads);
  ::setenv("GLOO_SOCKET_IFNAME", "lo", 0);  // loopback, unless told otherwise
  auto group = torchamp::init_process_group(torchamp::ProcessGroupOptions()
                                                .backend("gloo")
                                                .init_method("file://" + store_file)
                                                .rank(rank)
                                                .world_size(2)
                                                .timeout(std::chrono::seconds(60)));

  auto plain = make_model(a), by_hand = make_model(a), wrapped = make_model(a);
  torchamp::DistributedDataParallelOptions ddp_options;
  if (a.bucket_cap_mb > 0) {
    ddp_options.bucket_cap_mb(a.bucket_cap_mb);
  }
  torchamp::DistributedDataParallel ddp(wrapped.ptr(), group, ddp_options);
  torch::optim::SGD opt_plain(plain->parameters(), 1e-4), opt_hand(by_hand->parameters(), 1e-4),
      opt_ddp(wrapped->parameters(), 1e-4);
  torch::manual_seed(1 + rank);
  const auto x = torch::randn({a.batch, a.width}), y = torch::randn({a.batch, a.width});

  auto line_up = [&] {
    std::vector<at::Tensor> t = {torch::zeros({1})};
    group->allreduce(t)->wait();
  };
  double backward_ms = 0;
  auto step = [&](int which) {
    line_up();
    const auto t0 = Clock::now();
    if (which == 0 || which == 1) {
      auto& model = which == 0 ? plain : by_hand;
      auto& opt = which == 0 ? opt_plain : opt_hand;
      opt.zero_grad();
      const auto loss = torch::mse_loss(model->forward(x), y);
      const auto t1 = Clock::now();
      loss.backward();
      if (which == 0) {
        backward_ms = std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
      }
      if (which == 1) {
        all_reduce_after_backward(*group, *model);
      }
      opt.step();
    } else {
      opt_ddp.zero_grad();
      torch::mse_loss(ddp.forward([&] { return wrapped->forward(x); }), y).backward();
      opt_ddp.step();
    }
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  for (int w = 0; w < 3; ++w) {  // warm-up, and DDP's bucket rebuild
    for (int v = 0; v < 3; ++v) {
      step(v);
    }
  }
  std::vector<double> ms[3], bw;
  for (int r = 0; r < a.rounds; ++r) {
    for (int k = 0; k < 3; ++k) {
      const int v = (r + k) % 3;  // each variant first in a third of the rounds
      ms[v].push_back(step(v));
      if (v == 0) {
        bw.push_back(backward_ms);
      }
    }
  }
  if (rank == 0) {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double c = median(ms[0]), h = median(ms[1]), d = median(ms[2]), b = median(bw);
    int64_t bytes = 0;
    for (const auto& p : wrapped->parameters()) {
      bytes += p.numel() * 4;
    }
    std::printf(
        "2 ranks, %d intra-op thread(s) each, %d rounds; %d x Linear(%d, %d), batch %d "
        "per rank: %.1f MB of gradients, backward %.1f ms; buckets %zu\n",
        a.threads, a.rounds, a.layers, a.width, a.width, a.batch, static_cast<double>(bytes) / 1e6,
        b, ddp.bucket_indices().size());
    std::printf("| step | median ms | vs compute only | all-reduce after backward / this |\n");
    std::printf("|---|---|---|---|\n");
    std::printf("| compute only (no communication) | %.1f | 1.00 | |\n", c);
    std::printf("| all-reduce after backward | %.1f | %.2f | 1.00 |\n", h, h / c);
    std::printf("| torchamp::DistributedDataParallel | %.1f | %.2f | %.2f |\n", d, d / c, h / d);
    std::printf(
        "communication: %.1f ms after backward, %.1f ms not hidden by DDP (%.0f%% "
        "overlapped)\n",
        h - c, d - c, h > c ? 100.0 * (1.0 - (d - c) / (h - c)) : 0.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (const char* r = std::getenv("BENCH_DDP_RANK")) {
    return rank_main(a, std::atoi(r), std::getenv("BENCH_DDP_STORE"));
  }
  const std::string store =
      (std::filesystem::temp_directory_path() / ("bench_ddp-" + std::to_string(::getpid())))
          .string();
  std::filesystem::remove(store);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
      env_strings.emplace_back(*e);
    }
    env_strings.push_back("BENCH_DDP_RANK=" + std::to_string(rank));
    env_strings.push_back("BENCH_DDP_STORE=" + store);
    std::vector<char*> env;
    for (auto& s : env_strings) {
      env.push_back(s.data());
    }
    env.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()) != 0) {
      std::perror("posix_spawn");
      return 1;
    }
    pids.push_back(pid);
  }
  int code = 0;
  for (const pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    code |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove(store);
  return code;
}
