#include <torchamp/distributed.h>

#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

#include <exception>
#include <vector>

namespace torchamp {

GradScaler::FoundInfReducer all_reduce_found_inf(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                 std::optional<std::chrono::milliseconds> timeout) {
  TORCH_CHECK_VALUE(group, "all_reduce_found_inf: the process group is null");
  return [group, timeout](bool found_inf, c10::Device device) {
    std::vector<at::Tensor> flag = {at::full({1}, found_inf ? 1.0f : 0.0f,
                                             at::TensorOptions().dtype(at::kFloat).device(device))};
    try {
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::MAX;
      auto work = group->allreduce(flag, opts);
      if (timeout) {
        work->wait(*timeout);
      } else {
        work->wait();
      }
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "GradScaler: the all-reduce of found_inf over the process group failed ",
                  "on rank ", group->getRank(), " of ", group->getSize(),
                  "; nothing was unscaled and no stage changed. Cause: ", e.what());
    }
    return flag.front().item<float>() != 0.0f;
  };
}

}  // namespace torchamp
