#pragma once

// Only for a LibTorch whose headers lack this file (Debian's libtorch-dev
// 1.13 ships c10d/reducer.hpp, which includes it, but not the distributed
// autograd headers); CMake puts this folder on data_parallel.cpp's include
// path only then. reducer.hpp needs two names from it, for a member's type
// and a static_assert: the callback type and the context pointer, both as
// the real header declares them. Nothing here is defined or called.

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch {
namespace distributed {
namespace autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace autograd
}  // namespace distributed
}  // namespace torch
