#include "train.h"

#include <torchamp/autocast.h>
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include <torch/torch.h>

#include <chrono>
#include <memory>

namespace torchamp_train {
namespace {

constexpr int64_t kHidden = 128;
constexpr int kHiddenLayers = 3;

// How many of a gradient's entries are zero in float16 (underflowed: "flushed"),
// and how many are subnormal there (below 2^-14, float16's smallest normal),
// out of all entries. For a float32 or bfloat16 gradient this is what float16
// would do to it; for a float16 one (real float16 autocast) what it did.
struct Underflow {
  int64_t total = 0, flushed = 0, subnormal = 0;
  void add(const at::Tensor& grad) {
    const at::Tensor h = grad.detach().to(at::kHalf).to(at::kFloat);
    total += h.numel();
    flushed += h.eq(0).sum().item<int64_t>();
    subnormal += h.ne(0).logical_and(h.abs().lt(6.103515625e-05)).sum().item<int64_t>();
  }
  double fraction(int64_t n) const {
    return total == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(total);
  }
};

// An MLP 64 -> 128 -> 128 -> 128 -> 10 with tanh. In the fp16 modes on a
// LibTorch without CPU float16 autocast (< 2.2) every activation is stored in
// float16 between layers, so the activation gradients flowing back through it
// are float16, as in fp16 training; from 2.2 on the fp16 modes run under real
// float16 autocast instead (matmuls in float16).
struct Net : torch::nn::Module {
  Net() {
    int64_t in = 64;
    for (int i = 0; i < kHiddenLayers; ++i) {
      layers.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(in, kHidden)));
      in = kHidden;
    }
    out = register_module("out", torch::nn::Linear(in, 10));
  }

  // `half_storage`: round-trip activations through float16. `stats`: when
  // given, every activation's gradient is measured on its way back.
  at::Tensor forward(at::Tensor x, bool half_storage, Underflow* stats) {
    auto store = [&](at::Tensor a) {
      if (half_storage) {
        a = a.to(at::kHalf).to(at::kFloat);
      }
      if (stats != nullptr && a.requires_grad()) {
        a.register_hook([stats](const at::Tensor& g) { stats->add(g); });
      }
      return a;
    };
    for (auto& layer : layers) {
      x = store(torch::tanh(layer->forward(x)));
    }
    return store(out->forward(x));
  }

  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear out{nullptr};
};

bool cuda_present() {
  return torch::cuda::is_available();
}

// LibTorch's optimizer, or torchamp's fused one of the same name (the same
// options either way).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<at::Tensor> params,
                                                        const Config& config) {
  if (config.optimizer == "adamw") {
    const auto options = torch::optim::AdamWOptions(config.lr).weight_decay(1e-4);
    if (config.fused) {
      return std::make_unique<torchamp::optim::AdamW>(std::move(params), options);
    }
    return std::make_unique<torch::optim::AdamW>(std::move(params), options);
  }
  TORCH_CHECK_VALUE(config.optimizer == "sgd", "unknown optimizer '", config.optimizer, "'");
  const auto options = torch::optim::SGDOptions(config.lr).momentum(0.9);
  if (config.fused) {
    return std::make_unique<torchamp::optim::SGD>(std::move(params), options);
  }
  return std::make_unique<torch::optim::SGD>(std::move(params), options);
}

}  // namespace

bool cpu_fp16_autocast() {
  return torchamp::autocast::is_supported(torch::kCPU, torch::kHalf);
}

std::vector<std::string> known_modes() {
  return {"fp32", "fp16", "fp16+scaler", "bf16+scaler", "cuda-fp16+scaler"};
}

std::vector<std::string> available_modes() {
  std::vector<std::string> modes = {"fp32", "fp16", "fp16+scaler", "bf16+scaler"};
  if (cuda_present()) {
    modes.push_back("cuda-fp16+scaler");
  }
  return modes;
}

ModeResult train_mode(const std::string& mode, const Dataset& train, const Dataset& test,
                      const Config& config, const Progress& progress) {
  const auto start = std::chrono::steady_clock::now();
  const bool fp16 = mode == "fp16" || mode == "fp16+scaler";
  const bool fp16_autocast = fp16 && cpu_fp16_autocast();
  const bool half_storage = fp16 && !fp16_autocast;
  const bool cuda = mode == "cuda-fp16+scaler";
  const bool autocast_bf16 = mode == "bf16+scaler";
  const torch::Device device = cuda ? torch::kCUDA : torch::kCPU;

  ModeResult result;
  result.mode = mode;
  result.scaled = mode.find("+scaler") != std::string::npos;

  torch::manual_seed(config.seed);  // the same initial weights in every mode
  auto net = std::make_shared<Net>();
  net->to(device);
  const std::unique_ptr<torch::optim::Optimizer> optimizer_ptr =
      make_optimizer(net->parameters(), config);
  torch::optim::Optimizer& optimizer = *optimizer_ptr;
  double step_seconds = 0;
  torchamp::GradScaler scaler(torchamp::GradScalerOptions()
                                  .init_scale(config.init_scale)
                                  .growth_interval(config.growth_interval)
                                  .enabled(result.scaled));

  const at::Tensor x_train = train.x.to(device), y_train = train.y.to(device);
  const int64_t n = x_train.size(0);
  const int64_t per_epoch = (n + config.batch_size - 1) / config.batch_size;
  const int64_t total = per_epoch * config.epochs;
  Underflow overall;
  int64_t step = 0;
  for (int epoch = 0; epoch < config.epochs; ++epoch) {
    // The same batch order in every mode.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(config.seed * 1000003 + epoch);
    const at::Tensor order = torch::randperm(n, gen, torch::kLong).to(device);
    for (int64_t b = 0; b < per_epoch; ++b) {
      const at::Tensor idx =
          order.slice(0, b * config.batch_size, std::min(n, (b + 1) * config.batch_size));
      const at::Tensor x = x_train.index_select(0, idx), y = y_train.index_select(0, idx);
      optimizer.zero_grad();
      Underflow stats;
      at::Tensor logits;
      {
        // bf16+scaler: CPU autocast (bfloat16); fp16 modes on LibTorch >= 2.2:
        // CPU autocast (float16); cuda: CUDA autocast (float16).
        std::optional<torchamp::autocast> guard;
        if (autocast_bf16) {
          guard.emplace(torch::kCPU);
        } else if (fp16_autocast) {
          guard.emplace(torch::kCPU, torch::kHalf);
        } else if (cuda) {
          guard.emplace(torch::kCUDA);
        }
        logits = net->forward(x, half_storage, &stats);
      }
      const at::Tensor loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y);
      scaler.scale(loss).backward();
      const auto step_start = std::chrono::steady_clock::now();
      if (!scaler.step(optimizer).has_value()) {
        ++result.skipped;
      }
      step_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      if (result.scaled) {
        scaler.update();
      }
      overall.total += stats.total;
      overall.flushed += stats.flushed;
      overall.subnormal += stats.subnormal;
      StepRecord rec{step,
                     epoch,
                     loss.item<double>(),
                     scaler.get_scale(),
                     result.skipped,
                     stats.fraction(stats.flushed),
                     stats.fraction(stats.subnormal)};
      result.steps.push_back(rec);
      ++step;
      if (progress) {
        progress(mode, rec, total);
      }
    }
  }

  torch::NoGradGuard no_grad;
  result.final_loss =
      torch::nn::functional::cross_entropy(net->forward(x_train, false, nullptr), y_train)
          .item<double>();
  const at::Tensor pred = net->forward(test.x.to(device), false, nullptr).argmax(1);
  result.test_accuracy = pred.eq(test.y.to(device)).to(torch::kDouble).mean().item<double>();
  result.final_scale = scaler.get_scale();
  result.underflow = overall.fraction(overall.flushed);
  result.subnormal = overall.fraction(overall.subnormal);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.step_ms = step > 0 ? 1e3 * step_seconds / static_cast<double>(step) : 0.0;
  return result;
}

}  // namespace torchamp_train
