// bench_checkpoint: the peak memory and time of a training step (forward,
// backward) of a deep MLP under bfloat16 autocast, without checkpointing and
// with torchamp::checkpoint_sequential, interleaved in one process.
// bench/bench_checkpoint.py runs it beside the same step in Python with
// torch.utils.checkpoint and prints the table (docs/benchmarks.md).
//
//   bench_checkpoint [--layers 16] [--width 512] [--batch 4096] [--segments 4]
//                    [--rounds 5] [--threads 1]
//
// Peak memory is measured, not computed: the process's peak resident set
// (VmHWM), reset before each step through /proc/self/clear_refs, less the
// resident set at the step's start. Run it with MALLOC_MMAP_THRESHOLD_=65536
// (the script does) so that freed tensors leave the resident set at once;
// glibc's default keeps freed memory for reuse and hides the peak.
//
// Prints one line per mode: `mode plain peak_mb 123.4 ms 456.7 ...`.
#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>

#include <ATen/Parallel.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

// A field of /proc/self/status, in kB.
long status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) {
      return std::atol(line.c_str() + prefix.size());
    }
  }
  return -1;
}

void reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, long> opt{{"layers", 16},  {"width", 512}, {"batch", 4096},
                                  {"segments", 4}, {"rounds", 5},  {"threads", 1}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = std::string(argv[i]).substr(2);
    if (std::string(argv[i]).rfind("--", 0) != 0 || opt.count(key) == 0) {
      std::cerr << "bench_checkpoint: unknown option " << argv[i] << "\n";
      return 2;
    }
    opt[key] = std::atol(argv[i + 1]);
  }
  at::set_num_threads(static_cast<int>(opt["threads"]));
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (long l = 0; l < opt["layers"]; ++l) {
    model->push_back(torch::nn::Linear(opt["width"], opt["width"]));
    model->push_back(torch::nn::GELU());
  }
  const auto x = torch::randn({opt["batch"], opt["width"]}).requires_grad_(true);
  const std::vector<std::string> modes{"plain", "checkpoint"};
  std::map<std::string, std::vector<double>> ms, peak;

  const auto step = [&](const std::string& mode) {
    for (auto& p : model->parameters()) {
      p.mutable_grad() = torch::Tensor();
    }
    x.mutable_grad() = torch::Tensor();
    torch::Tensor out;
    {
      torchamp::autocast guard(torch::kCPU, torch::kBFloat16);
      out = mode == "plain" ? model->forward(x)
                            : torchamp::checkpoint_sequential(model, opt["segments"], x);
    }
    // (In statements of their own, as in Python, whose temporaries die at
    // once: a C++ temporary lives to the end of its full expression, here
    // through backward.)
    const auto loss = out.to(torch::kFloat).pow(2).mean();
    loss.backward();
  };
  for (const auto& mode : modes) {
    step(mode);  // warm-up
  }
  for (long r = 0; r < opt["rounds"]; ++r) {
    for (const auto& mode : modes) {
      const long base = status_kb("VmRSS");
      reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      step(mode);
      const auto t1 = std::chrono::steady_clock::now();
      ms[mode].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      peak[mode].push_back((status_kb("VmHWM") - base) / 1024.0);
    }
  }
  long param_bytes = 0;
  for (const auto& p : model->parameters()) {
    param_bytes += p.numel() * static_cast<long>(p.element_size());
  }
  for (const auto& mode : modes) {
    std::printf("mode %s peak_mb %.1f ms %.1f params_mb %.1f\n", mode.c_str(), median(peak[mode]),
                median(ms[mode]), param_bytes / 1048576.0);
  }
  return 0;
}
