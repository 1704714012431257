// Data-parallel training with a GradScaler, one process per rank, launched by
// torchrun:  torchrun --nproc-per-node 2 --no-python ./build/examples/ddp_train
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torchamp/gloo.h>
#include <torchamp/torchamp.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

static std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

int main() {
  // torchrun's environment. Its agent serves a store at MASTER_PORT in its own
  // torch's protocol; rank 0 serves ours on the next port.
  const int rank = std::stoi(env("RANK", "0")), world = std::stoi(env("WORLD_SIZE", "1"));
  c10d::TCPStoreOptions store_options;
  store_options.port =
      static_cast<std::uint16_t>(std::stoi(env("MASTER_PORT", "29500")) +
                                 (env("TORCHELASTIC_USE_AGENT_STORE", "") == "True" ? 1 : 0));
  store_options.isServer = rank == 0;
  store_options.numWorkers = world;
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "ddp_train", torchamp::make_tcp_store(env("MASTER_ADDR", "127.0.0.1"), store_options));
  auto gloo = c10d::ProcessGroupGloo::Options::create();
  gloo->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto group = torchamp::make_gloo_process_group(store, rank, world, gloo);

  torch::manual_seed(rank);  // construction gives every rank rank 0's weights
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 4));
  torchamp::DistributedDataParallel ddp(model.ptr(), group);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torchamp::GradScaler scaler;

  for (int step = 0; step < 20; ++step) {
    torch::manual_seed(1000 * rank + step);  // this rank's slice of the batch
    auto x = torch::randn({32, 16});
    const auto y = (x.sum(1) > 0).to(torch::kLong);
    if (step == 10 && rank == world - 1) {
      x[0][0] = INFINITY;  // an overflow in one rank's data: every rank skips
    }
    auto loss = [&](int half) {  // two micro-batches of 16
      const auto out = ddp.forward([&] { return model->forward(x.chunk(2)[half]); });
      return torch::nn::functional::cross_entropy(out, y.chunk(2)[half]) / 2;
    };
    {
      auto no_sync = ddp.no_sync();  // the first one's gradients stay local
      scaler.scale(loss(0)).backward();
    }
    scaler.scale(loss(1)).backward();  // the sum of both is averaged over the ranks
    const bool stepped = scaler.step(opt).has_value();
    scaler.update();
    opt.zero_grad();
    if (!stepped) {
      std::cout << "rank " << rank << ": step " << step << " skipped, scale now "
                << scaler.get_scale() << "\n";
    }
  }
  const double checksum = model[0]->as<torch::nn::Linear>()->weight.sum().item<double>();
  std::cout << "rank " << rank << ": done, scale " << scaler.get_scale() << ", weight sum "
            << checksum << "\n";
}
