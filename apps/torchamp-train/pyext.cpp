// torchamp-train as a Python extension, for a LibTorch without Gloo's C++
// headers (the pip wheels): torchamp_train_dist.py forms the Gloo process
// group with Python's torch.distributed (the wheel's own Gloo, inside
// libtorch_cpu) and hands it to main(), which runs the same program as the
// torchamp-train executable over it.

#include "parallel.h"

#include <torch/csrc/utils/pybind.h>

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

PYBIND11_MODULE(torchamp_train_ext, m) {
  m.def(
      "main",
      [](std::vector<std::string> args, pybind11::object group) {
        c10::intrusive_ptr<c10d::ProcessGroup> pg;
        if (!group.is_none()) {
          pg = group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
        }
        std::vector<char*> argv;
        for (auto& a : args) {
          argv.push_back(a.data());
        }
        argv.push_back(nullptr);
        pybind11::gil_scoped_release no_gil;
        const int code = torchamp_train::run(
            static_cast<int>(args.size()), argv.data(),
            [&](const torchamp_train::LaunchEnv& env, const std::string& mode,
                std::chrono::milliseconds timeout) {
              TORCH_CHECK(
                  pg && pg->getSize() == env.world && pg->getRank() == env.rank,
                  "torchamp_train_ext.main: WORLD_SIZE=", env.world, " RANK=", env.rank,
                  " but the process group given is ",
                  pg ? std::to_string(pg->getRank()) + " of " + std::to_string(pg->getSize())
                     : std::string("None"));
              return torchamp_train::Parallel(pg, mode, timeout);
            });
        // The launcher leaves with os._exit, which flushes no C stdio buffer
        // (a pipe's or a file's would lose the table).
        std::cout.flush();
        std::fflush(stdout);
        std::fflush(stderr);
        return code;
      },
      "Runs torchamp-train with these arguments (argv[0] first) over the given c10d "
      "ProcessGroup (None: one process); returns the exit code.");
  m.def(
      "launch_error",
      []() -> std::string {
        try {
          torchamp_train::LaunchEnv::from_environment();
          return "";
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
      },
      "What is wrong with torchrun's environment variables for torchamp-train ('' if nothing).");
}
