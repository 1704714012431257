// What the C ABI costs over the C++ call it wraps, measured in one run:
//   step      scaler step + update over 10,000 float32 parameters of 100
//             elements (torchamp::optim::SGD takes the scale in its fused
//             update): GradScaler::step/update against torchamp_scaler_step/
//             torchamp_scaler_update on the same parameters and gradients;
//   unscale   the same with unscale_ first (the clipping loop);
//   call      one trivial call, get_scale, against torchamp_scaler_get_scale:
//             the ABI's fixed cost per call (NULL checks, the try block).
// The two sides alternate round by round (which goes first alternates too),
// so that the machine's drift falls on both; the table gives each side's
// median over the rounds and the median of the per-round ratios.
//
// Run: ./build/bench/bench_c_api [--rounds=N] [--threads=N]
#include <torchamp/c/torchamp.h>
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include <ATen/Parallel.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void ok(torchamp_status status) {
  if (status != TORCHAMP_OK) {
    std::fprintf(stderr, "C ABI: %s\n", torchamp_last_error());
    std::exit(1);
  }
}

// Seconds per iteration of `body`, run `iterations` times.
double time_per(int iterations, const std::function<void()>& body) {
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    body();
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / iterations;
}

struct Row {
  const char* name;
  double cpp, c, ratio;
};

// Interleaved rounds of the C++ side and the C side.
Row compare(const char* name, int rounds, int iterations, const std::function<void()>& cpp,
            const std::function<void()>& c) {
  time_per(iterations, cpp);  // warm-up
  time_per(iterations, c);
  std::vector<double> t_cpp, t_c, ratios;
  for (int r = 0; r < rounds; ++r) {
    double a, b;
    if (r % 2 == 0) {
      a = time_per(iterations, cpp);
      b = time_per(iterations, c);
    } else {
      b = time_per(iterations, c);
      a = time_per(iterations, cpp);
    }
    t_cpp.push_back(a);
    t_c.push_back(b);
    ratios.push_back(b / a);
  }
  return {name, median(t_cpp), median(t_c), median(ratios)};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 21;
  for (int a = 1; a < argc; ++a) {
    if (std::strncmp(argv[a], "--rounds=", 9) == 0) {
      rounds = std::max(1, std::atoi(argv[a] + 9));
    } else if (std::strncmp(argv[a], "--threads=", 10) == 0) {
      at::set_num_threads(std::max(1, std::atoi(argv[a] + 10)));
    } else {
      std::fprintf(stderr, "usage: %s [--rounds=N] [--threads=N]\n", argv[0]);
      return 2;
    }
  }
  torch::manual_seed(0);
  constexpr int kTensors = 10000;
  constexpr int kElements = 100;
  std::vector<at::Tensor> params;
  std::vector<torchamp_tensor*> handles;  // at::Tensor*, as a binding holds them
  for (int i = 0; i < kTensors; ++i) {
    params.push_back(torch::randn({kElements}).requires_grad_());
    params.back().mutable_grad() = torch::randn({kElements}) * 1e-3;
  }
  for (auto& p : params) {
    handles.push_back(reinterpret_cast<torchamp_tensor*>(&p));
  }
  // Scale 1 and no growth: unscale_ leaves the gradients as they are, so
  // every iteration does the same work.
  const auto scaler_options =
      torchamp::GradScalerOptions().init_scale(1.0).growth_interval(1 << 30);
  const double lr = 1e-6;

  torchamp::GradScaler scaler(scaler_options);
  torchamp::optim::SGD optimizer(params, torch::optim::SGDOptions(lr));

  torchamp_scaler_options c_options;
  torchamp_scaler_options_default(&c_options);
  c_options.init_scale = 1.0;
  c_options.growth_interval = 1 << 30;
  torchamp_scaler* c_scaler;
  ok(torchamp_scaler_new(&c_options, &c_scaler));
  torchamp_sgd_options sgd;
  torchamp_sgd_options_default(&sgd);
  sgd.lr = lr;
  torchamp_optimizer* c_optimizer;
  ok(torchamp_sgd_new(handles.data(), handles.size(), &sgd, &c_optimizer));

  std::vector<Row> rows;
  rows.push_back(compare(
      "step + update", rounds, 20,
      [&] {
        (void)scaler.step(optimizer);
        scaler.update();
      },
      [&] {
        int32_t stepped;
        ok(torchamp_scaler_step(c_scaler, c_optimizer, &stepped));
        ok(torchamp_scaler_update(c_scaler));
      }));
  rows.push_back(compare(
      "unscale_ + step + update", rounds, 20,
      [&] {
        scaler.unscale_(optimizer);
        (void)scaler.step(optimizer);
        scaler.update();
      },
      [&] {
        ok(torchamp_scaler_unscale_(c_scaler, c_optimizer));
        ok(torchamp_scaler_step(c_scaler, c_optimizer, nullptr));
        ok(torchamp_scaler_update(c_scaler));
      }));
  double sink = 0;
  rows.push_back(compare(
      "get_scale (one call)", rounds, 1000000, [&] { sink += scaler.get_scale(); },
      [&] {
        double s;
        ok(torchamp_scaler_get_scale(c_scaler, &s));
        sink += s;
      }));

  std::printf("\nC ABI against C++, %d x %d float32 parameters, %d threads, %d rounds\n", kTensors,
              kElements, at::get_num_threads(), rounds);
  std::printf("| call | C++ | C ABI | C ABI / C++ (median of rounds) |\n|---|---|---|---|\n");
  for (const Row& r : rows) {
    const bool tiny = r.cpp < 1e-6;
    std::printf("| %s | %.3f %s | %.3f %s | %.3f |\n", r.name, tiny ? r.cpp * 1e9 : r.cpp * 1e3,
                tiny ? "ns" : "ms", tiny ? r.c * 1e9 : r.c * 1e3, tiny ? "ns" : "ms", r.ratio);
  }
  std::printf("(checksum %g)\n", sink > 0 ? 1.0 : 0.0);
  torchamp_optimizer_free(c_optimizer);
  torchamp_scaler_free(c_scaler);
  return 0;
}
