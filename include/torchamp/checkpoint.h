#pragma once

/// \file
/// Activation checkpointing, Python's `torch.utils.checkpoint.checkpoint` and
/// `checkpoint_sequential`: keep a segment's inputs instead of its
/// activations and recompute them in backward, under the autocast state and
/// with the RNG state the forward ran with.

#include <torchamp/config.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch {
namespace nn {
class Sequential;
}  // namespace nn
}  // namespace torch

namespace torchamp {

/// What backward checks of a recomputation (Python's `determinism_check`).
enum class DeterminismCheck {
  /// "default": outputs of the forward's shapes, dtypes and devices, and no
  /// tensor requiring grad that the forward did not reach (`c10::Error`).
  kDefault,
  /// "none": only the second check.
  kNone,
};

/// Python's keyword arguments of `torch.utils.checkpoint.checkpoint`.
struct CheckpointOptions {
  /// Save the CPU RNG state (and that of each CUDA device an input is on)
  /// before the forward and run the recomputation from it, so that dropout
  /// draws the same masks; the RNG state after backward is what it was
  /// before it. Python's default, true.
  TORCH_ARG(bool, preserve_rng_state) = true;
  /// What backward checks of the recomputation; default `kDefault`.
  TORCH_ARG(DeterminismCheck, determinism_check) = DeterminismCheck::kDefault;

 public:
  /// The same by Python's name, "default" or "none"; `c10::ValueError`
  /// naming any other.
  CheckpointOptions& determinism_check(const std::string& name);
};

/// The type-erased function a checkpointed segment runs.
using CheckpointFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

namespace detail {
std::vector<at::Tensor> checkpoint(const CheckpointFunction& function,
                                   const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options);
}  // namespace detail

/// Python's `checkpoint_sequential(functions, segments, input)`: splits the
/// modules of `functions` into `segments` runs of `size() / segments`
/// modules (the last one takes the rest), checkpoints all but the last and
/// runs the last normally. Throws `c10::TypeError` for an empty holder,
/// `c10::ValueError` for `segments` < 1 or more segments than modules
/// (Python fails there with a less helpful error).
at::Tensor checkpoint_sequential(const torch::nn::Sequential& functions, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options = {});

namespace detail {

template <class T>
inline constexpr bool is_checkpoint_tensor_v = std::is_same_v<std::decay_t<T>, at::Tensor>;
template <class T>
inline constexpr bool is_checkpoint_tensors_v =
    std::is_same_v<std::decay_t<T>, std::vector<at::Tensor>>;
template <class T>
inline constexpr bool is_checkpoint_options_v = std::is_same_v<std::decay_t<T>, CheckpointOptions>;

inline void collect_checkpoint_arg(const at::Tensor& t, std::vector<at::Tensor>& inputs,
                                   CheckpointOptions&) {
  inputs.push_back(t);
}
inline void collect_checkpoint_arg(const std::vector<at::Tensor>& v,
                                   std::vector<at::Tensor>& inputs, CheckpointOptions&) {
  inputs = v;
}
inline void collect_checkpoint_arg(const CheckpointOptions& o, std::vector<at::Tensor>&,
                                   CheckpointOptions& options) {
  options = o;
}

inline std::vector<at::Tensor> checkpoint_outputs(at::Tensor t) {
  return {std::move(t)};
}
inline std::vector<at::Tensor> checkpoint_outputs(std::vector<at::Tensor> v) {
  return v;
}
template <class... Ts>
std::vector<at::Tensor> checkpoint_outputs(std::tuple<Ts...> t) {
  static_assert((is_checkpoint_tensor_v<Ts> && ...),
                "torchamp::checkpoint: the function's tuple must hold only tensors");
  return std::apply([](auto&&... x) { return std::vector<at::Tensor>{std::move(x)...}; },
                    std::move(t));
}

template <class Out, size_t... I>
Out checkpoint_tuple(std::vector<at::Tensor>& v, std::index_sequence<I...>) {
  return Out{std::move(v[I])...};
}

template <class Out>
Out checkpoint_result(std::vector<at::Tensor>&& v) {
  if constexpr (std::is_same_v<Out, at::Tensor>) {
    return std::move(v[0]);
  } else if constexpr (std::is_same_v<Out, std::vector<at::Tensor>>) {
    return std::move(v);
  } else {
    return checkpoint_tuple<Out>(v, std::make_index_sequence<std::tuple_size_v<Out>>{});
  }
}

// The result type checkpoint returns for `fn`'s: tensors by value (a tuple
// of references would refer into the call's temporaries).
template <class T>
struct checkpoint_value {
  using type = std::decay_t<T>;
};
template <class... Ts>
struct checkpoint_value<std::tuple<Ts...>> {
  using type = std::tuple<std::decay_t<Ts>...>;
};

// Whether `f` can be empty and is: a null pointer, an empty std::function,
// a null module holder (`is_empty()`).
template <class Fn, class = void>
struct has_is_empty : std::false_type {};
template <class Fn>
struct has_is_empty<Fn, std::void_t<decltype(std::declval<const Fn&>().is_empty())>>
    : std::true_type {};
template <class T>
struct is_std_function : std::false_type {};
template <class R, class... A>
struct is_std_function<std::function<R(A...)>> : std::true_type {};
template <class Fn>
bool is_empty_callable(const Fn& f) {
  if constexpr (std::is_pointer_v<Fn> || std::is_member_pointer_v<Fn> ||
                is_std_function<Fn>::value) {
    return f == nullptr;
  } else if constexpr (has_is_empty<Fn>::value) {
    return f.is_empty();
  } else {
    return false;
  }
}

template <class F, size_t... I>
decltype(auto) invoke_with(F& f, const std::vector<at::Tensor>& xs, std::index_sequence<I...>) {
  return std::invoke(f, xs[I]...);
}

}  // namespace detail

/// Python's `checkpoint(function, *args)`: `torchamp::checkpoint(fn, x, y)`
/// runs `fn(x, y)` keeping none of its activations and returns what it
/// returns; backward runs it again (under the forward's autocast state for
/// CPU and CUDA, with its cast-cache flag, and from its RNG state when
/// `preserve_rng_state`), then its backward. `fn` is a lambda, function or
/// module holder (`torch::nn::Linear`) taking tensors, or one
/// `std::vector<at::Tensor>` (pass one), and returning a tensor, a
/// `std::tuple` of tensors or a `std::vector` of them. A trailing
/// `CheckpointOptions` sets Python's keywords. `fn` is copied and kept until
/// backward: what it captures by reference must outlive that.
///
/// The gradients are those of Python's `use_reentrant=False`, the form
/// Python recommends: the parameters and other tensors requiring grad that
/// `fn` uses get gradients even when no input requires grad, each once (so
/// `DistributedDataParallel`, `no_sync()`, parameters used in several
/// segments and `torch::autograd::grad` work as without checkpointing, and
/// no `static_graph` is needed). With grad mode off (`torch::NoGradGuard`,
/// `c10::InferenceMode`) it only calls `fn`.
///
/// Throws `c10::TypeError` for an empty `fn` (null pointer, empty
/// `std::function` or holder), `c10::ValueError` for an unknown
/// `determinism_check`, before anything runs; in backward, `c10::Error` for
/// an input modified in place since the forward and for a recomputation that
/// does not match the forward.
template <class F, class... Args,
          std::enable_if_t<(sizeof...(Args) > 0) && ((detail::is_checkpoint_tensor_v<Args> ||
                                                      detail::is_checkpoint_tensors_v<Args> ||
                                                      detail::is_checkpoint_options_v<Args>)&&...),
                           int> = 0>
auto checkpoint(F&& fn, const Args&... args) {
  constexpr size_t kOptions = (size_t{detail::is_checkpoint_options_v<Args>} + ...);
  constexpr size_t kVectors = (size_t{detail::is_checkpoint_tensors_v<Args>} + ...);
  static_assert(kOptions <= 1, "torchamp::checkpoint: at most one CheckpointOptions");
  static_assert(
      kOptions == 0 || detail::is_checkpoint_options_v<
                           std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>>,
      "torchamp::checkpoint: the CheckpointOptions comes last");
  static_assert(kVectors == 0 || sizeof...(Args) - kOptions == 1,
                "torchamp::checkpoint: pass tensors, or one std::vector of them");
  constexpr size_t kTensors = sizeof...(Args) - kOptions;
  using Fn = std::decay_t<F>;
  using Seq = std::make_index_sequence<kTensors>;
  constexpr bool kVector = kVectors == 1;
  const auto call = [](Fn& f, const std::vector<at::Tensor>& xs) -> decltype(auto) {
    if constexpr (kVector) {
      return std::invoke(f, xs);
    } else {
      return detail::invoke_with(f, xs, Seq{});
    }
  };
  using Out = typename detail::checkpoint_value<decltype(call(
      std::declval<Fn&>(), std::declval<const std::vector<at::Tensor>&>()))>::type;
  Fn f(std::forward<F>(fn));
  TORCH_CHECK_TYPE(!detail::is_empty_callable(f),
                   "torchamp::checkpoint: the function is empty (a null pointer, std::function "
                   "or module holder); expected something to call");
  std::vector<at::Tensor> inputs;
  CheckpointOptions options;
  (detail::collect_checkpoint_arg(args, inputs, options), ...);
  CheckpointFunction erased = [f = std::move(f), call](const std::vector<at::Tensor>& xs) mutable {
    return detail::checkpoint_outputs(call(f, xs));
  };
  return detail::checkpoint_result<Out>(detail::checkpoint(erased, inputs, options));
}

}  // namespace torchamp
