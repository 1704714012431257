// The distributed test scenarios (dist_scenarios.h) as a Python extension, for
// LibTorches without Gloo's C++ headers (the pip wheels): dist_worker.py makes
// a real Gloo process group with Python's torch.distributed (the wheel's own
// Gloo, inside libtorch_cpu) and hands it to run(), which gives it to
// torchamp::set_process_group exactly as dist_worker.cpp does with its own.
#include "dist_scenarios.h"

#include <torch/csrc/utils/pybind.h>

PYBIND11_MODULE(torchamp_dist_ext, m) {
  m.def(
      "run",
      [](const std::string& scenario, int rank, int world, pybind11::object group,
         const std::string& out_path) {
        c10::intrusive_ptr<c10d::ProcessGroup> pg;
        if (!group.is_none()) {
          pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
        }
        pybind11::gil_scoped_release no_gil;
        return torchamp_dist::run_scenario(
            scenario, rank, world,
            [&]() {
              TORCH_CHECK(pg, "scenario ", scenario, " needs a process group");
              return pg;
            },
            out_path);
      },
      "Runs one rank of a scenario over the given c10d ProcessGroup (None: none); returns the "
      "exit code.");
}
