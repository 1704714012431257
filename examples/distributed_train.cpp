// Sharded (ZeRO-1 style) training with a GradScaler on every rank, over c10d
// with Gloo. Launch as torchrun users expect, one process per rank:
//   MASTER_ADDR, MASTER_PORT  where rank 0 serves the TCPStore (env://)
//   WORLD_SIZE, RANK          the group size and this process's rank
//   GLOO_SOCKET_IFNAME        optional: the network interface to use (e.g. lo)
// Each rank computes gradients on its own data, the gradients are averaged,
// and each rank steps only the parameters it owns. An overflow can then show
// up on one rank only; set_process_group makes every rank skip that step.
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torchamp/torchamp.h>

#include <iostream>
#include <vector>

int main() {
  auto group = torchamp::init_process_group(torchamp::ProcessGroupOptions().backend("gloo"));
  const int rank = group->getRank();
  const int world = group->getSize();

  torch::manual_seed(0);  // the same initial weights on every rank
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 4));
  auto params = model->parameters();
  std::vector<torch::Tensor> mine;  // this rank's shard: every world-th parameter
  for (size_t i = 0; i < params.size(); ++i) {
    if (static_cast<int>(i) % world == rank) {
      mine.push_back(params[i]);
    }
  }
  torch::optim::SGD optimizer(mine, torch::optim::SGDOptions(0.1).momentum(0.9));
  torchamp::GradScaler scaler;
  torchamp::set_process_group(scaler, group);  // every rank skips together

  for (int step = 0; step < 20; ++step) {
    torch::manual_seed(1000 * rank + step);  // this rank's data
    auto x = torch::randn({32, 16});
    auto y = (x.sum(1) > 0).to(torch::kLong);
    optimizer.zero_grad();
    for (auto& p : params) {
      p.mutable_grad() = torch::Tensor();
    }
    scaler.scale(torch::nn::functional::cross_entropy(model->forward(x), y)).backward();
    for (size_t i = 0; i < params.size(); ++i) {  // average; keep only my shard
      std::vector<torch::Tensor> g = {params[i].grad()};
      group->allreduce(g)->wait();
      if (static_cast<int>(i) % world == rank) {
        params[i].mutable_grad().div_(world);
      } else {
        params[i].mutable_grad() = torch::Tensor();
      }
    }
    if (step == 10 && rank == world - 1) {  // an overflow in one rank's shard only
      mine.front().mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
    }
    const bool stepped = scaler.step(optimizer).has_value();
    scaler.update();
    for (size_t i = 0; i < params.size(); ++i) {  // owners send their parameters
      std::vector<torch::Tensor> t = {params[i].detach()};
      c10d::BroadcastOptions bo;
      bo.rootRank = static_cast<int>(i) % world;
      group->broadcast(t, bo)->wait();
    }
    if (!stepped) {
      std::cout << "rank " << rank << ": step " << step << " skipped on every rank, scale now "
                << scaler.get_scale() << "\n";
    }
  }
  std::cout << "rank " << rank << ": done, scale " << scaler.get_scale() << "\n";
}
