#pragma once

// What the C ABI's opaque handles are, and the one wrapper every entry point
// runs its body in (not installed).

#include <torchamp/c/torchamp.h>
#include <torchamp/grad_scaler.h>
#include <torchamp/paddle.h>

#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <new>
#include <string>
#include <vector>

struct torchamp_scaler {
  // Exactly one is set.
  std::unique_ptr<torchamp::GradScaler> core;
  std::unique_ptr<torchamp::paddle::GradScaler> paddle;

  template <class F>
  decltype(auto) visit(F&& f) {
    return paddle ? f(*paddle) : f(*core);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return paddle ? f(static_cast<const torchamp::paddle::GradScaler&>(*paddle))
                  : f(static_cast<const torchamp::GradScaler&>(*core));
  }
};

struct torchamp_optimizer {
  std::unique_ptr<torch::optim::Optimizer> impl;
  std::function<at::Tensor(const at::Tensor&)> master_weight;  // the concrete type's
};

namespace torchamp {
namespace c_api {

/// The at::Tensor a handle is.
inline at::Tensor& tensor_of(torchamp_tensor* handle) {
  return *reinterpret_cast<at::Tensor*>(handle);
}
inline const at::Tensor& tensor_of(const torchamp_tensor* handle) {
  return *reinterpret_cast<const at::Tensor*>(handle);
}
/// A new handle the caller frees with torchamp_tensor_free.
inline torchamp_tensor* new_handle(at::Tensor tensor) {
  return reinterpret_cast<torchamp_tensor*>(new at::Tensor(std::move(tensor)));
}

/// c10::TypeError "<function>: <what> is NULL" for a null pointer.
template <class T>
T& need(T* pointer, const char* function, const char* what) {
  TORCH_CHECK_TYPE(pointer != nullptr, function, ": ", what, " is NULL");
  return *pointer;
}

/// The tensors of a handle array, checked for NULLs.
std::vector<at::Tensor> tensors_of(torchamp_tensor* const* handles, size_t count,
                                   const char* function, const char* what);

/// Records a failure as this thread's last error; returns its status.
torchamp_status fail(torchamp_status status, const char* message) noexcept;

/// Runs `body`, turning every exception into a status and a message.
template <class F>
torchamp_status guarded(F&& body) noexcept {
  try {
    body();
    return TORCHAMP_OK;
  } catch (const c10::TypeError& e) {
    return fail(TORCHAMP_TYPE_ERROR, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    return fail(TORCHAMP_VALUE_ERROR, e.what_without_backtrace());
  } catch (const c10::NotImplementedError& e) {
    return fail(TORCHAMP_NOT_IMPLEMENTED_ERROR, e.what_without_backtrace());
  } catch (const c10::OutOfMemoryError& e) {  // a device allocator's
    return fail(TORCHAMP_OUT_OF_MEMORY, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return fail(TORCHAMP_RUNTIME_ERROR, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return fail(TORCHAMP_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return fail(TORCHAMP_RUNTIME_ERROR, e.what());
  } catch (...) {
    return fail(TORCHAMP_RUNTIME_ERROR, "unknown error");
  }
}

/// Stores a new object through `out` once `make` succeeded (out unchanged otherwise).
template <class T, class F>
torchamp_status make_into(T** out, const char* function, F&& make) noexcept {
  return guarded([&] {
    need(out, function, "out");
    std::unique_ptr<T> made = make();
    *out = made.release();
  });
}

}  // namespace c_api
}  // namespace torchamp
