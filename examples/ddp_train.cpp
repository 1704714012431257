// Data-parallel training with a GradScaler, one process per rank, launched by
// torchrun:  torchrun --nproc-per-node 2 --no-python ./build/examples/ddp_train
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torchamp/torchamp.h>

#include <c10/util/Exception.h>

#include <cmath>
#include <iostream>

int main() try {
  // dist.init_process_group(): torchrun's env:// (torchamp::is_torchelastic_launched() says
  // whether torchrun started this process)
  c10::intrusive_ptr<c10d::ProcessGroup> group = torchamp::init_process_group();
  const int rank = group->getRank(), world = group->getSize();

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
    for (int half = 0; half < 2; ++half) {
      // All but the last micro-batch's gradients stay local; the last
      // backward averages the sum of both over the ranks.
      torchamp::DistributedDataParallel::NoSync no_sync = ddp.no_sync(half == 0);
      scaler.scale(loss(half)).backward();
    }
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
  return 0;
} catch (const c10::Error& e) {  // torchamp's typed errors (ValueError, ...): no torchrun, say
  std::cerr << "ddp_train: " << e.what_without_backtrace() << "\n";
  return 2;
}
