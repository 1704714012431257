#pragma once

// The one place where LibTorch versions differ (not installed).
//
// Everything version-dependent that torchamp uses goes through here, keyed on
// TORCH_VERSION_MAJOR/MINOR from <torch/version.h>.

#include <ATen/Version.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define TORCHAMP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||           \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if TORCHAMP_TORCH_AT_LEAST(2, 4)
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#define TORCHAMP_ATEN_FUSED_OPTIMIZERS 1
#else
#define TORCHAMP_ATEN_FUSED_OPTIMIZERS 0
#endif

// ATen's multi-tensor copy (LibTorch 2.x; 1.13 has none).
#if __has_include(<ATen/ops/_foreach_copy.h>)
#include <ATen/ops/_foreach_copy.h>
#define TORCHAMP_ATEN_FOREACH_COPY 1
#else
#define TORCHAMP_ATEN_FOREACH_COPY 0
#endif

namespace torchamp {
namespace compat {

/// LibTorch 2.4 generalised the autocast state to `(DeviceType)` getters and
/// setters and deprecated the per-device ones; earlier versions only have the
/// per-device functions.
#if TORCHAMP_TORCH_AT_LEAST(2, 4)
inline bool autocast_enabled(c10::DeviceType d) {
  return at::autocast::is_autocast_enabled(d);
}
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  at::autocast::set_autocast_enabled(d, on);
}
inline at::ScalarType autocast_dtype(c10::DeviceType d) {
  return at::autocast::get_autocast_dtype(d);
}
inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
inline bool autocast_enabled(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled() : at::autocast::is_enabled();
}
inline void set_autocast_enabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(on);
  } else {
    at::autocast::set_enabled(on);
  }
}
inline at::ScalarType autocast_dtype(c10::DeviceType d) {
  return d == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                   : at::autocast::get_autocast_gpu_dtype();
}
inline void set_autocast_dtype(c10::DeviceType d, at::ScalarType t) {
  if (d == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(t);
  } else {
    at::autocast::set_autocast_gpu_dtype(t);
  }
}
#endif

/// CPU autocast to float16 arrived in LibTorch 2.2; before that CPU autocast
/// only knows bfloat16 (Python's torch.autocast warns and disables itself).
constexpr bool kCpuAutocastFloat16 = TORCHAMP_TORCH_AT_LEAST(2, 2);

/// Collects the text of the warnings (TORCH_WARN) given while it is the
/// installed handler (`WarningHandlerGuard` below). LibTorch 2.0
/// changed the handler's hook from (location, message, verbatim) to a
/// `c10::Warning`.
struct WarningCollector : c10::WarningHandler {
  std::vector<std::string> messages;
#if TORCHAMP_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) override {
    messages.push_back(warning.msg());
  }
#else
  void process(const c10::SourceLocation& /*where*/, const std::string& message,
               const bool /*verbatim*/) override {
    messages.push_back(message);
  }
#endif
};

/// Installs a warning handler for its scope (c10::WarningUtils' since 2.0,
/// c10::Warning's before).
#if TORCHAMP_TORCH_AT_LEAST(2, 0)
using WarningHandlerGuard = c10::WarningUtils::WarningHandlerGuard;
#else
using WarningHandlerGuard = c10::Warning::WarningHandlerGuard;
#endif

/// The version of the LibTorch this program runs against, as the loaded
/// library reports it (`TORCH_VERSION` in its build settings, what Python's
/// `torch.__config__.show()` prints), not the header it was compiled against;
/// the header's `TORCH_VERSION` only where the library does not say. For error
/// messages (it parses `at::show_config()`). Debian's 1.13.1+dfsg package
/// reports 1.13.0 in both: its build was given version 1.13.0a0.
inline std::string runtime_torch_version() {
  const std::string config = at::show_config();
  const std::string key = "TORCH_VERSION=";
  const auto begin = config.find(key);
  if (begin == std::string::npos) {
    return TORCH_VERSION;
  }
  const auto start = begin + key.size();
  return config.substr(start, config.find_first_of(", \n", start) - start);
}

/// ATen's `_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`
/// have CPU kernels from LibTorch 2.3 on.
constexpr bool kAtenHasCpuAmpKernels = TORCHAMP_TORCH_AT_LEAST(2, 3);

/// The first element of a dense tensor that has elements, for writing:
/// `tensor.data_ptr()` without its out-of-line checks (a virtual
/// has_storage() and more), for the GradScaler's per-step walk over
/// thousands of gradients. LibTorch 2.1 made the storage's write access
/// `mutable_data_ptr()`, which also materialises a copy-on-write storage
/// (2.3+) before anyone writes to it.
inline void* dense_data_for_write(const c10::TensorImpl& tensor) {
  const c10::TensorImpl* impl = &tensor;
  c10::StorageImpl* storage = impl->unsafe_storage().unsafeGetStorageImpl();
  TORCH_CHECK(storage != nullptr, "torchamp: a dense tensor without storage");
#if TORCHAMP_TORCH_AT_LEAST(2, 1)
  char* base = static_cast<char*>(storage->mutable_data_ptr().get());
#else
  char* base = static_cast<char*>(storage->data_ptr().get());
#endif
  return base + impl->storage_offset() * static_cast<int64_t>(impl->dtype().itemsize());
}

/// The key of a parameter in `torch::optim::Optimizer::state()`: LibTorch 2.x
/// keys by the TensorImpl's address, 1.13 by that address printed as a
/// string (as c10::guts::to_string printed it). Chosen from the map's own key
/// type.
template <class StateMap>
typename StateMap::key_type optim_state_key(const StateMap& /*state*/, const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;
    os << static_cast<const void*>(param.unsafeGetTensorImpl());
    return os.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

/// ATen's multi-tensor `_fused_adam_`, `_fused_adamw_` and `_fused_sgd_`,
/// which torchamp's optimizers use for CUDA parameters: all three, with the
/// GradScaler arguments, from LibTorch 2.4 on (`_fused_sgd_` is younger than
/// the Adam ones). Below that, CUDA parameters take the base class's step.
constexpr bool kAtenFusedOptimizers = TORCHAMP_ATEN_FUSED_OPTIMIZERS;

/// Whether ATen's `_foreach_norm` takes the result's dtype (newer LibTorch;
/// 1.13's has none): detected from the declaration, not a version.
template <typename List, typename = void>
struct ForeachNormTakesDtype : std::false_type {};
template <typename List>
struct ForeachNormTakesDtype<List, std::void_t<decltype(at::_foreach_norm(
                                       std::declval<List>(), std::declval<const at::Scalar&>(),
                                       std::declval<c10::optional<at::ScalarType>>()))>>
    : std::true_type {};

/// Whether ATen has `_foreach_mul_(TensorList, const Tensor&)` (2.1 and
/// newer; before, a Tensor argument would bind to the TensorList overload as
/// a one-element list): the overload's exact type, not a call.
template <typename List, typename = void>
struct ForeachMulTakesTensor : std::false_type {};
template <typename List>
struct ForeachMulTakesTensor<
    List, std::void_t<decltype(static_cast<void (*)(List, const at::Tensor&)>(&at::_foreach_mul_))>>
    : std::true_type {};

// Both ops came with LibTorch 2.1 (pytorch#102725, #106677): from 2.2 on a
// false trait means their declarations changed, which would quietly bring
// back an op a tensor.
static_assert(
    !TORCHAMP_TORCH_AT_LEAST(2, 2) || ForeachNormTakesDtype<at::TensorList>::value,
    "_foreach_norm(TensorList, Scalar, optional<ScalarType>) not found: update the trait");
static_assert(!TORCHAMP_TORCH_AT_LEAST(2, 2) || ForeachMulTakesTensor<at::TensorList>::value,
              "_foreach_mul_(TensorList, const Tensor&) not found: update the trait");

/// Every tensor times the 0-dim `factor` (on their device), in place: ATen's
/// multi-tensor `_foreach_mul_` (one kernel on CUDA) where it takes a tensor,
/// else a `mul_` each (the same bits).
template <typename List>
void foreach_mul_in(List tensors, const at::Tensor& factor) {
  if constexpr (ForeachMulTakesTensor<List>::value) {
    at::_foreach_mul_(tensors, factor);
  } else {
    for (const at::Tensor& t : tensors) {
      t.mul_(factor);
    }
  }
}
inline void foreach_mul_(at::TensorList tensors, const at::Tensor& factor) {
  foreach_mul_in<at::TensorList>(tensors, factor);
}

/// `dst[i].copy_(src[i])` for each i (the dtype may change, as copy_ does;
/// the lists have one length): ATen's multi-tensor `_foreach_copy_` where
/// it has one (on CUDA one kernel for pairs of one layout), else a copy_
/// each (the same bits).
inline void foreach_copy_(at::TensorList dst, at::TensorList src) {
  TORCH_INTERNAL_ASSERT(dst.size() == src.size());
#if TORCHAMP_ATEN_FOREACH_COPY
  if (!dst.empty()) {  // ATen's foreach ops refuse empty lists
    at::_foreach_copy_(dst, src);
  }
#else
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i].copy_(src[i]);
  }
#endif
}

/// Each tensor's 2-norm, accumulated and returned in float64 (dense tensors
/// of one device and dtype): ATen's multi-tensor `_foreach_norm` where it
/// takes a dtype (one kernel for the list on CUDA), else one
/// `linalg_vector_norm` each (what `_foreach_norm` does on the CPU anyway).
template <typename List>
std::vector<at::Tensor> norms_in_float64_in(List tensors) {
  if constexpr (ForeachNormTakesDtype<List>::value) {
    return at::_foreach_norm(tensors, 2, at::kDouble);
  } else {
    std::vector<at::Tensor> norms;
    norms.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      norms.push_back(at::linalg_vector_norm(t, 2, c10::nullopt, false, at::kDouble));
    }
    return norms;
  }
}
inline std::vector<at::Tensor> norms_in_float64(at::TensorList tensors) {
  return norms_in_float64_in<at::TensorList>(tensors);
}

/// One fused Adam (`decoupled`: AdamW) step over tensors of one device and
/// dtype. `steps`: one float32 tensor per parameter on that device, the step
/// count including this step. With `grad_scale` (a float32 one-element tensor
/// on that device) each gradient is divided by it, and written back so; with
/// `found_inf` (the same, 0: clean) not 0 nothing changes.
inline void fused_adam(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                       at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                       at::TensorList steps, double lr, const at::Tensor& lr_tensor, double beta1,
                       double beta2, double weight_decay, double eps, bool amsgrad, bool decoupled,
                       const c10::optional<at::Tensor>& grad_scale,
                       const c10::optional<at::Tensor>& found_inf) {
#if TORCHAMP_ATEN_FUSED_OPTIMIZERS
  if (lr_tensor.defined()) {  // the tensor_lr overloads: the rate read on the device
    const at::Tensor lr_on = lr_tensor.to(params.front().device());
    if (decoupled) {
      at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr_on, beta1,
                        beta2, weight_decay, eps, amsgrad, /*maximize=*/false, grad_scale,
                        found_inf);
    } else {
      at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr_on, beta1,
                       beta2, weight_decay, eps, amsgrad, /*maximize=*/false, grad_scale,
                       found_inf);
    }
  } else if (decoupled) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1,
                      beta2, weight_decay, eps, amsgrad, /*maximize=*/false, grad_scale, found_inf);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2,
                     weight_decay, eps, amsgrad, /*maximize=*/false, grad_scale, found_inf);
  }
#else
  (void)params, (void)grads, (void)exp_avgs, (void)exp_avg_sqs, (void)max_exp_avg_sqs, (void)steps,
      (void)lr, (void)lr_tensor, (void)beta1, (void)beta2, (void)weight_decay, (void)eps,
      (void)amsgrad, (void)decoupled, (void)grad_scale, (void)found_inf;
  TORCH_CHECK(false, "torchamp: ATen's fused optimizers need LibTorch 2.4 or later");
#endif
}

/// One fused SGD step over tensors of one device and dtype; `momentum_buffers`
/// empty when momentum is 0. `first_step`: every buffer is new and takes the
/// first direction (as the base class's clone).
inline void fused_sgd(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                      double weight_decay, double momentum, double lr, const at::Tensor& lr_tensor,
                      double dampening, bool nesterov, bool first_step,
                      const c10::optional<at::Tensor>& grad_scale,
                      const c10::optional<at::Tensor>& found_inf) {
#if TORCHAMP_ATEN_FUSED_OPTIMIZERS
  if (lr_tensor.defined()) {
    at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum,
                    lr_tensor.to(params.front().device()), dampening, nesterov,
                    /*maximize=*/false, first_step, grad_scale, found_inf);
  } else {
    at::_fused_sgd_(params, grads, momentum_buffers, weight_decay, momentum, lr, dampening,
                    nesterov, /*maximize=*/false, first_step, grad_scale, found_inf);
  }
#else
  (void)params, (void)grads, (void)momentum_buffers, (void)weight_decay, (void)momentum, (void)lr,
      (void)lr_tensor, (void)dampening, (void)nesterov, (void)first_step, (void)grad_scale,
      (void)found_inf;
  TORCH_CHECK(false, "torchamp: ATen's fused optimizers need LibTorch 2.4 or later");
#endif
}

/// c10d's `Reducer` constructor (the engine of Python's DDP) changed its
/// arguments over the versions: LibTorch 1.13 takes per-bucket size limits
/// after the bucket indices; later versions dropped them and added, one by
/// one, `skip_all_reduce_unused_params`, `use_python_reducer` and per-bucket
/// byte caps (2.13 has all three). The form is chosen by what this
/// LibTorch's `Reducer` can be constructed from (`Reducer` is a template
/// parameter so that this header need not include reducer.hpp); the added
/// arguments get Python's defaults (false, false, none).
template <class Reducer, class Args>
struct constructible_from;
template <class Reducer, class... Args>
struct constructible_from<Reducer, std::tuple<Args...>> : std::is_constructible<Reducer, Args...> {
};

template <class Reducer, class Group, class Names>
std::shared_ptr<Reducer> make_reducer(std::vector<at::Tensor> params,
                                      std::vector<std::vector<size_t>> buckets,
                                      std::vector<size_t> per_bucket_limits, Group group,
                                      std::vector<bool> sparse, int64_t bucket_bytes_cap,
                                      bool find_unused, bool as_view, Names names,
                                      int64_t first_bucket_bytes_cap) {
  auto make = [](auto args) {
    return std::apply([](auto&... a) { return std::make_shared<Reducer>(std::move(a)...); }, args);
  };
  const auto with_limits =
      std::make_tuple(params, buckets, per_bucket_limits, group, sparse, bucket_bytes_cap,
                      find_unused, as_view, names, first_bucket_bytes_cap);
  const auto without = std::make_tuple(params, buckets, group, sparse, bucket_bytes_cap,
                                       find_unused, as_view, names, first_bucket_bytes_cap);
  const auto skip = std::tuple_cat(without, std::make_tuple(false));
  const auto skip_python = std::tuple_cat(without, std::make_tuple(false, false));
  const auto skip_python_caps =
      std::tuple_cat(without, std::make_tuple(false, false, std::vector<int64_t>{}));
  if constexpr (constructible_from<Reducer, std::decay_t<decltype(with_limits)>>::value) {
    return make(with_limits);  // 1.13
  } else if constexpr (constructible_from<Reducer,
                                          std::decay_t<decltype(skip_python_caps)>>::value) {
    return make(skip_python_caps);  // 2.13
  } else if constexpr (constructible_from<Reducer, std::decay_t<decltype(skip_python)>>::value) {
    return make(skip_python);
  } else if constexpr (constructible_from<Reducer, std::decay_t<decltype(skip)>>::value) {
    return make(skip);
  } else {
    static_assert(constructible_from<Reducer, std::decay_t<decltype(without)>>::value,
                  "torchamp: this LibTorch's c10d::Reducer has a constructor compat.h does not "
                  "know");
    return make(without);
  }
}

/// c10d's process groups. In 1.13 a backend (`ProcessGroupGloo`,
/// `ProcessGroupNCCL`) is itself the `ProcessGroup`; from 2.0 on it is a
/// `c10d::Backend` that a `ProcessGroup` dispatches to per device.
constexpr bool kProcessGroupHasBackends = TORCH_VERSION_MAJOR >= 2;

/// Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) Python's workers are
/// clients of the store the agent serves at MASTER_PORT. The agent is the
/// launcher's torch, and 1.13's TCPStore client cannot talk to a 2.x server
/// (Debian 12's own torchrun, 1.13 on Python 3.11, cannot start workers, so
/// a 2.x one launches them): a 1.13 build's rank 0 then serves a store of its
/// own at MASTER_PORT + 1.
constexpr bool kTcpStoreJoinsAgentStore = TORCH_VERSION_MAJOR >= 2;

/// A `ProcessGroup` over `store`: 2.6 on take (store, rank, size); 2.0-2.5
/// also the group's options (backend name and timeout).
template <class ProcessGroup, class Store>
c10::intrusive_ptr<ProcessGroup> make_process_group(const c10::intrusive_ptr<Store>& store,
                                                    int rank, int size, const std::string& backend,
                                                    std::chrono::milliseconds timeout) {
  if constexpr (std::is_constructible_v<ProcessGroup, c10::intrusive_ptr<Store>, int, int>) {
    (void)backend;
    (void)timeout;
    return c10::make_intrusive<ProcessGroup>(store, rank, size);
  } else {
    using Options = typename ProcessGroup::Options;
    return c10::make_intrusive<ProcessGroup>(store, rank, size,
                                             c10::make_intrusive<Options>(backend, timeout));
  }
}

/// What a backend is held as: `intrusive_ptr<c10d::Backend>` from 2.0 on,
/// the group itself in 1.13.
template <class ProcessGroup, class = void>
struct backend_ptr {
  using type = c10::intrusive_ptr<ProcessGroup>;
};
template <class ProcessGroup>
struct backend_ptr<ProcessGroup,
                   std::void_t<decltype(std::declval<ProcessGroup&>().getDefaultBackend())>> {
  using type = std::decay_t<decltype(std::declval<ProcessGroup&>().getDefaultBackend())>;
};

/// The group Python's `_new_process_group_helper` assembles over `store`
/// (already `PrefixStore("<name>/")`): per device ("cpu", "cuda") the backend
/// `make(name, store)` forms ("gloo", "nccl"), over `PrefixStore("<device>/")`;
/// one backend for every device when they all name the same one; NCCL the
/// default where it is one of them. 1.13 has one backend per group, formed
/// over `store` itself.
template <class ProcessGroup, class PrefixStore, class Store, class Make>
c10::intrusive_ptr<ProcessGroup> assemble_group(
    const c10::intrusive_ptr<Store>& store, int rank, int size,
    const std::vector<std::pair<std::string, std::string>>& device_backends,
    std::chrono::milliseconds timeout, Make make) {
  if constexpr (kProcessGroupHasBackends) {
    using Type = typename ProcessGroup::BackendType;
    auto type_of = [](const std::string& name) { return name == "nccl" ? Type::NCCL : Type::GLOO; };
    bool one = true;
    bool nccl = false;
    for (const auto& [device, name] : device_backends) {
      one = one && name == device_backends.front().second;
      nccl = nccl || name == "nccl";
    }
    auto group = make_process_group<ProcessGroup>(
        store, rank, size, one ? device_backends.front().second : "gloo", timeout);
    group->setDefaultBackend(nccl ? Type::NCCL : Type::GLOO);
    typename backend_ptr<ProcessGroup>::type shared;
    for (const auto& [device, name] : device_backends) {
      if (!one || !shared) {
        shared = make(name, c10::make_intrusive<PrefixStore>(device + "/", store));
      }
      group->setBackend(c10::Device(device).type(), type_of(name), shared);
    }
    return group;
  } else {
    (void)rank;
    (void)size;
    (void)timeout;
    for (const auto& entry : device_backends) {
      TORCH_CHECK_NOT_IMPLEMENTED(entry.second == device_backends.front().second,
                                  "torchamp: LibTorch 1.13's process groups have one backend; "
                                  "give backend \"gloo\" or \"nccl\", not one per device");
    }
    return make(device_backends.front().second, store);
  }
}

template <class T, class = void>
struct has_use_libuv : std::false_type {};
template <class T>
struct has_use_libuv<T, std::void_t<decltype(std::declval<T&>().useLibUV)>> : std::true_type {};

/// Asks for (or declines) TCPStore's libuv server where the options have
/// the choice (2.2 on); returns whether it was asked for.
template <class TCPStoreOptions>
bool set_use_libuv(TCPStoreOptions& options, bool on) {
  if constexpr (has_use_libuv<TCPStoreOptions>::value) {
    options.useLibUV = on;
    return on;
  } else {
    (void)options;
    (void)on;
    return false;
  }
}

template <class T, class = void>
struct has_set_group_name : std::false_type {};
template <class T>
struct has_set_group_name<
    T, std::void_t<decltype(std::declval<T&>().setGroupName(std::declval<std::string>()))>>
    : std::true_type {};

/// Names the group as Python does ("0" for the default group, then "1",
/// ...) where the ProcessGroup has names (2.2 on).
template <class ProcessGroup>
void set_group_name(ProcessGroup& group, const std::string& name) {
  if constexpr (has_set_group_name<ProcessGroup>::value) {
    group.setGroupName(name);
  } else {
    (void)group;
    (void)name;
  }
}

/// Autograd nodes are owned by `std::shared_ptr` up to LibTorch 2.x's switch
/// to `c10::intrusive_ptr` (2.13 has it); `NodePtr` is the pointer this
/// LibTorch's `Edge::function` holds, and `make_node` makes a `T` owned the
/// same way.
template <class P>
struct is_shared_ptr : std::false_type {};
template <class T>
struct is_shared_ptr<std::shared_ptr<T>> : std::true_type {};
template <class T, class NodePtr, class... Args>
auto make_node(Args&&... args) {
  if constexpr (is_shared_ptr<NodePtr>::value) {
    return std::make_shared<T>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<T>(std::forward<Args>(args)...);
  }
}

/// LibTorch 2.0 keeps a tensor's hooks on its node (`tensor_pre_hooks()`,
/// `retains_grad_hooks()`), and its engine runs them also where
/// `torch::autograd::grad` captures a gradient at that node; 1.13's capture
/// runs none. While one lives, a node's tensor hooks are set aside.
template <class NodeT>
class TensorHooksAside {
 public:
  explicit TensorHooksAside(NodeT& node) : node_(&node) {
#if TORCHAMP_TORCH_AT_LEAST(2, 0)
    std::swap(pre_, node.tensor_pre_hooks());
    std::swap(retains_, node.retains_grad_hooks());
#endif
  }
  ~TensorHooksAside() {
#if TORCHAMP_TORCH_AT_LEAST(2, 0)
    if (node_ != nullptr) {
      std::swap(pre_, node_->tensor_pre_hooks());
      std::swap(retains_, node_->retains_grad_hooks());
    }
#endif
  }
  TensorHooksAside(TensorHooksAside&& o) noexcept
      : node_(o.node_), pre_(std::move(o.pre_)), retains_(std::move(o.retains_)) {
    o.node_ = nullptr;
  }
  TensorHooksAside(const TensorHooksAside&) = delete;
  TensorHooksAside& operator=(const TensorHooksAside&) = delete;
  TensorHooksAside& operator=(TensorHooksAside&&) = delete;

 private:
#if TORCHAMP_TORCH_AT_LEAST(2, 0)
  using Pre = std::decay_t<decltype(std::declval<NodeT&>().tensor_pre_hooks())>;
  using Retains = std::decay_t<decltype(std::declval<NodeT&>().retains_grad_hooks())>;
#else
  struct Pre {};
  struct Retains {};
#endif
  NodeT* node_;
  Pre pre_;
  Retains retains_;
};

}  // namespace compat
}  // namespace torchamp
