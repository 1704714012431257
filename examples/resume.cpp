// Exact resume in a program of your own: what a checkpoint must hold so that
// a restarted process (torchrun --max-restarts) continues as if nothing had
// happened. A bfloat16 model with dropout, torchamp's fused AdamW with
// float32 master weights, a GradScaler: 30 steps in one go, then 12 steps,
// a checkpoint, everything built anew from other seeds, the checkpoint
// loaded, and the other 18 steps. The parameters must be the same bits.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/serialize.h>
#include <torch/utils.h>
#include <torchamp/torchamp.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <iostream>
#include <mutex>
#include <string>

struct Run {
  bool seeded;  // first: the model's initial weights come from this run's seed
  torch::nn::Sequential model{torch::nn::Linear(16, 64), torch::nn::Dropout(0.2),
                              torch::nn::Linear(64, 4)};
  torchamp::optim::AdamW opt;
  torchamp::GradScaler scaler{torchamp::GradScalerOptions().init_scale(1e9).growth_interval(3)};
  int64_t step = 0;  // the data position: which batch comes next

  explicit Run(uint64_t seed)
      : seeded((torch::manual_seed(seed), true)),
        opt((model->to(torch::kBFloat16), model->parameters()), torch::optim::AdamWOptions(1e-2),
            torchamp::optim::FusedOptions().master_weights(true)) {}

  void train(int64_t until) {
    for (; step < until; ++step) {
      const auto x = torch::sin(torch::arange(32 * 16).reshape({32, 16}) * 0.01 * (step + 1));
      const auto y = torch::cos(torch::arange(32 * 4).reshape({32, 4}) * 0.02 * (step + 1));
      const auto out = model->forward(x.to(torch::kBFloat16)).to(torch::kFloat);  // dropout: RNG
      scaler.scale(torch::nn::functional::mse_loss(out, y)).backward();
      scaler.step(opt);
      scaler.update();
      opt.zero_grad();
    }
  }

  // Model, optimizer (with its master weights), scaler, RNG, data position.
  void save(const std::string& path) {
    torch::serialize::OutputArchive archive, model_part, opt_part, scaler_part;
    model->save(model_part);
    opt.save(opt_part);
    scaler_part << scaler;
    archive.write("model", model_part);
    archive.write("optimizer", opt_part);
    archive.write("scaler", scaler_part);
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    archive.write("rng", generator.get_state());
    archive.write("step", torch::tensor(step));
    archive.save_to(path);
  }

  void load(const std::string& path) {
    torch::serialize::InputArchive archive, model_part, opt_part, scaler_part;
    archive.load_from(path);
    archive.read("model", model_part);
    archive.read("optimizer", opt_part);
    archive.read("scaler", scaler_part);
    model->load(model_part);
    opt.load(opt_part);
    scaler_part >> scaler;
    at::Tensor rng, position;
    archive.read("rng", rng);
    archive.read("step", position);
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rng);
    step = position.item<int64_t>();
  }
};

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "resume-checkpoint.pt";
  Run whole(0);
  whole.train(30);

  Run first(0);
  first.train(12);
  first.save(path);  // a process killed after this ...
  Run restarted(7);  // ... and its restart: other weights, another RNG state
  restarted.load(path);
  restarted.train(30);

  bool same = whole.scaler.get_scale() == restarted.scaler.get_scale();
  const auto a = whole.model->parameters(), b = restarted.model->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    same = same && a[i].equal(b[i]) &&
           whole.opt.master_weight(a[i]).equal(restarted.opt.master_weight(b[i]));
  }
  std::cout
      << "30 steps in one go, and 12 + checkpoint + all built anew (seed 7) + load + 18: scale "
      << restarted.scaler.get_scale() << ", parameters and masters "
      << (same ? "bit for bit equal" : "DIFFER") << "\n";
  return same ? 0 : 1;
}
