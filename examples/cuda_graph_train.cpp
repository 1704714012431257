// A whole mixed-precision training iteration captured once in a CUDA graph
// and replayed: autocast forward, scaled backward, clipping (folded into the
// step), torchamp's fused AdamW with a scheduled learning rate and the
// scaler's update. The scaler keeps its
// scale and flags on the GPU, so nothing in the iteration reads back to the
// host. The program checks that N replays give the bits of N eager
// iterations, in float16 with a GradScaler and in bfloat16 with one
// (overflows injected from the data on the device: skipped steps, backoffs
// and growths), and in bfloat16 without one, as bfloat16 usually trains.
//
//   cuda_graph_train [iterations]     (default 100; exit 77 without a GPU)
#include <torchamp/torchamp.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

namespace {

constexpr int64_t kBatch = 256, kIn = 64, kWidth = 512;
constexpr int kWarmup = 3;  // eager iterations before the capture (the optimizer's state)

// One training run: the model, its optimizer and scaler, and the static
// tensors an iteration reads (x, y) and writes (loss).
struct Run {
  c10::ScalarType dtype;
  torch::nn::Sequential model;
  torchamp::optim::AdamW opt;
  torchamp::GradScaler scaler;
  at::Tensor x, y, loss;
  at::Tensor lr;  // the learning rate the step reads on the device (a schedule writes it)

  Run(c10::ScalarType dtype_, bool scaled)
      : dtype(dtype_),
        model((torch::manual_seed(0),
               torch::nn::Sequential(torch::nn::Linear(kIn, kWidth), torch::nn::GELU(),
                                     torch::nn::Linear(kWidth, kWidth), torch::nn::GELU(),
                                     torch::nn::Linear(kWidth, 1)))),
        opt((model->to(torch::kCUDA), model->parameters()),
            torch::optim::AdamWOptions(1e-3).weight_decay(0.01)),
        scaler(torchamp::GradScalerOptions().init_scale(1024).growth_interval(8).enabled(scaled)),
        x(torch::empty({kBatch, kIn}, torch::kCUDA)),
        y(torch::empty({kBatch, 1}, torch::kCUDA)),
        lr(opt.lr_tensor(0)) {}

  // The iteration, as any training loop writes it, with no host read: the
  // norm stays a tensor (clip_grad_norm_tensor_) and step()'s result is not
  // asked. Autocast's weight cache is off, as under any CUDA graph.
  void iteration() {
    opt.zero_grad();
    {
      torchamp::autocast guard(torch::kCUDA, dtype, true, /*cache_enabled=*/false);
      loss = torch::nn::functional::mse_loss(model->forward(x).to(torch::kFloat), y);
    }
    scaler.scale(loss).backward();
    scaler.clip_grad_norm_tensor_(opt, 1.0);
    scaler.step(opt);
    scaler.update();
  }
};

// Bit-for-bit equality of two tensors (NaNs with NaNs).
bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         a.contiguous().view(torch::kByte).equal(b.contiguous().view(torch::kByte));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Trains `n` iterations eagerly and `kWarmup` eager + `n - kWarmup` replays
// of one captured iteration, over the same batches; true if they agree bit
// for bit: every iteration's loss and scale, the weights and the scaler.
bool compare(const char* name, c10::ScalarType dtype, bool scaled, int n) {
  // A side stream for everything below, the data included (capture needs a
  // stream that is not the default one; one stream keeps the order).
  const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
  const c10::cuda::CUDAStreamGuard on_stream(stream);
  torch::manual_seed(1);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const at::Tensor xs = torch::randn({n, kBatch, kIn}, cuda);
  const at::Tensor ys = xs.narrow(2, 0, 8).sum(2, true).mul(0.3).tanh();
  if (scaled) {  // an inf in some batches: the overflow comes from the device's data
    for (int i = 11; i < n; i += 29) {
      xs[i][7][3] = std::numeric_limits<float>::infinity();
    }
  }
  const at::Tensor one = torch::ones({}, cuda);
  // iteration i's loss and the scale after it, recorded on the device
  auto record = [&](Run& r, at::Tensor& losses, at::Tensor& scales, int i) {
    losses[i].copy_(r.loss.detach());
    scales[i].copy_(r.scaler.scale(one));
  };
  auto feed = [&](Run& r, int i) {  // the batch and a linear decay of the rate
    r.x.copy_(xs[i]);
    r.y.copy_(ys[i]);
    r.lr.fill_(1e-3 * (1.0 - 0.9 * i / n));
  };

  Run eager(dtype, scaled);
  at::Tensor eager_loss = torch::empty({n}, cuda), eager_scale = torch::empty({n}, cuda);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    if (i == kWarmup) {  // from here a device-to-host sync is an error
      torch::cuda::synchronize();
      t0 = std::chrono::steady_clock::now();
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    }
    feed(eager, i);
    eager.iteration();
    record(eager, eager_loss, eager_scale, i);
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  const double eager_s = seconds_since(t0);

  Run graphed(dtype, scaled);
  at::Tensor graph_loss = torch::empty({n}, cuda), graph_scale = torch::empty({n}, cuda);
  for (int i = 0; i < kWarmup; ++i) {
    feed(graphed, i);
    graphed.iteration();
    record(graphed, graph_loss, graph_scale, i);
  }
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  graphed.iteration();
  graph.capture_end();
  torch::cuda::synchronize();
  t0 = std::chrono::steady_clock::now();
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  for (int i = kWarmup; i < n; ++i) {
    feed(graphed, i);
    graph.replay();
    record(graphed, graph_loss, graph_scale, i);
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  const double graph_s = seconds_since(t0);

  bool same = same_bits(eager_loss, graph_loss) && same_bits(eager_scale, graph_scale);
  // The weights, and AdamW's moments and step counts (the counts caught up
  // from the device, where the replays advanced them).
  eager.opt.fused_step_counts_to_host();
  graphed.opt.fused_step_counts_to_host();
  const auto a = eager.model->parameters(), b = graphed.model->parameters();
  for (size_t p = 0; p < a.size(); ++p) {
    const auto& sa = static_cast<const torch::optim::AdamWParamState&>(
        *eager.opt.state().at(a[p].unsafeGetTensorImpl()));
    const auto& sb = static_cast<const torch::optim::AdamWParamState&>(
        *graphed.opt.state().at(b[p].unsafeGetTensorImpl()));
    same = same && same_bits(a[p], b[p]) && same_bits(sa.exp_avg(), sb.exp_avg()) &&
           same_bits(sa.exp_avg_sq(), sb.exp_avg_sq()) && sa.step() == sb.step();
  }
  same = same && eager.scaler.get_scale() == graphed.scaler.get_scale() &&
         eager.scaler.get_growth_tracker() == graphed.scaler.get_growth_tracker();
  const auto s = eager_scale.cpu();
  int skipped = 0, growths = 0;
  for (int i = 1; i < n; ++i) {
    skipped += s[i].item<float>() < s[i - 1].item<float>();
    growths += s[i].item<float>() > s[i - 1].item<float>();
  }
  const int timed = n - kWarmup;
  std::printf(
      "%-13s %d iterations: %d skipped, %d growths, final scale %g, loss %.4f -> %.4f; "
      "eager %.3f ms, replay %.3f ms an iteration (%.2fx); replay == eager: %s\n",
      name, n, skipped, growths, eager.scaler.get_scale(), eager_loss[0].item<double>(),
      eager_loss[n - 1].item<double>(), 1e3 * eager_s / timed, 1e3 * graph_s / timed,
      eager_s / graph_s, same ? "bit for bit" : "NO");
  std::fflush(stdout);  // into a pipe too before the next comparison, which may throw
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::puts("cuda_graph_train: no CUDA device; nothing to do");
    return 77;
  }
  const int n = argc > 1 ? std::atoi(argv[1]) : 100;
  if (n <= kWarmup) {
    std::fprintf(stderr, "cuda_graph_train: iterations must be > %d, got %s\n", kWarmup, argv[1]);
    return 2;
  }
  const bool fp16 = compare("fp16+scaler", torch::kHalf, true, n);
  const bool bf16_scaled = compare("bf16+scaler", torch::kBFloat16, true, n);
  const bool bf16 = compare("bf16", torch::kBFloat16, false, n);
  return fp16 && bf16_scaled && bf16 ? 0 : 1;
}
