// Activation checkpointing (include/torchamp/checkpoint.h).
//
// Python's non-reentrant checkpoint keeps the forward's graph and drops its
// saved tensors through saved-tensor hooks, which LibTorch only accepts as
// Python objects. This is the other construction, with the non-reentrant
// results:
//
// - The forward runs `function` once with grad mode on, on detached copies of
//   the inputs, and walks the graph it built from the outputs down to the
//   edges that leave it: into the inputs, and into the tensors requiring grad
//   that `function` reached by itself (parameters, captured tensors). Nodes
//   created during the call are the ones with this thread's sequence numbers
//   from its start on. Then that graph and its activations are dropped, and
//   the outputs (detached) hang off one CheckpointBackward node whose next
//   edges are exactly those boundary edges. A segment whose inputs need no
//   grad therefore still leads to its parameters (Python's reentrant form,
//   whose forward runs under no_grad, gives them nothing), DDP's
//   find_unused_parameters sees them, and each parameter's accumulator runs
//   once per backward, in the outer backward, as without checkpointing.
// - Backward recomputes under the saved autocast and RNG state and runs the
//   recomputed graph with the engine's own `execute`, capturing the
//   gradients at those boundary edges instead of running them (what
//   `torch::autograd::grad` does), and returns them as the node's gradients.
//
// The transient cost of the first point: inside one segment's forward its
// activations live until the segment ends, as they do again while its
// backward recomputes them, so the peak is the recomputation's.
#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>

#include <ATen/Context.h>
#include <ATen/SequenceNumber.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/util/irange.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/container/sequential.h>

#include "compat/compat.h"

#include <algorithm>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_set>

namespace torchamp {
namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

// ---- autocast and RNG state ------------------------------------------------

struct AutocastState {
  bool cpu_enabled;
  at::ScalarType cpu_dtype;
  bool cuda_enabled;
  at::ScalarType cuda_dtype;
  bool cache_enabled;

  static AutocastState current() {
    return {
        autocast::is_enabled(c10::DeviceType::CPU), autocast::current_dtype(c10::DeviceType::CPU),
        autocast::is_enabled(c10::DeviceType::CUDA), autocast::current_dtype(c10::DeviceType::CUDA),
        at::autocast::is_autocast_cache_enabled()};
  }
};

// Python's recomputation: `with torch.autocast(device, **fwd_kwargs),
// torch.autocast("cpu", **fwd_cpu_kwargs)`, both device types, each with the
// forward's enabled flag, dtype and cache flag (a disabled device keeps its
// dtype where that dtype can be autocast to at all).
class AutocastReplay {
 public:
  explicit AutocastReplay(const AutocastState& s) {
    const auto dtype = [](c10::DeviceType d, at::ScalarType t) {
      return autocast::is_supported(d, t) ? t : autocast::default_dtype(d);
    };
    cuda_.emplace(c10::DeviceType::CUDA, dtype(c10::DeviceType::CUDA, s.cuda_dtype), s.cuda_enabled,
                  s.cache_enabled);
    cpu_.emplace(c10::DeviceType::CPU, dtype(c10::DeviceType::CPU, s.cpu_dtype), s.cpu_enabled,
                 s.cache_enabled);
  }
  ~AutocastReplay() {
    cpu_.reset();  // innermost first
    cuda_.reset();
  }
  AutocastReplay(const AutocastReplay&) = delete;
  AutocastReplay& operator=(const AutocastReplay&) = delete;

 private:
  std::optional<autocast> cuda_;
  std::optional<autocast> cpu_;
};

struct RngState {
  at::Tensor cpu;
  std::vector<std::pair<c10::Device, at::Tensor>> devices;
};

at::Tensor generator_state(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Python's `_get_device_states(*args)`: the CUDA devices the inputs are on.
std::vector<c10::Device> cuda_devices(const std::vector<at::Tensor>& inputs) {
  std::vector<c10::Device> out;
  for (const auto& t : inputs) {
    if (t.defined() && t.is_cuda() && std::find(out.begin(), out.end(), t.device()) == out.end()) {
      out.push_back(t.device());
    }
  }
  return out;
}

// Python's `torch.get_rng_state()` and the default generator of each device.
RngState capture_rng(const std::vector<c10::Device>& devices) {
  RngState s;
  s.cpu = generator_state(at::detail::getDefaultCPUGenerator());
  for (const auto& d : devices) {
    s.devices.emplace_back(d, generator_state(at::globalContext().defaultGenerator(d)));
  }
  return s;
}

void restore_rng(const RngState& s) {
  set_generator_state(at::detail::getDefaultCPUGenerator(), s.cpu);
  for (const auto& [device, state] : s.devices) {
    set_generator_state(at::globalContext().defaultGenerator(device), state);
  }
}

// Python's `torch.random.fork_rng`: the forward's RNG state for the
// recomputation, then the state backward found, whatever happens.
class RngReplay {
 public:
  explicit RngReplay(const std::optional<RngState>& forward) {
    if (forward) {
      std::vector<c10::Device> devices;
      for (const auto& d : forward->devices) {
        devices.push_back(d.first);
      }
      now_ = capture_rng(devices);
      restore_rng(*forward);
    }
  }
  ~RngReplay() {
    if (now_) {
      restore_rng(*now_);
    }
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  std::optional<RngState> now_;
};

// ---- the graph a call built ------------------------------------------------

using EdgeKey = std::pair<const Node*, uint32_t>;

EdgeKey key(const Edge& e) {
  return {e.function.get(), e.input_nr};
}

bool is_leaf_cast(const Node& n) {
  // An autocast cast of a leaf from the cast cache, made earlier in this
  // forward (by another segment). Walking through it to the leaf keeps the
  // boundary the same when the recomputation, under a fresh cache, casts the
  // leaf itself.
  if (n.name() != "ToCopyBackward0" || n.num_outputs() != 1) {
    return false;
  }
  const auto& next = n.next_edge(0);
  return next.is_valid() && next.function->sequence_nr() == std::numeric_limits<uint64_t>::max();
}

// The edges out of the graph `outputs` were computed by since `seq_start`:
// those into nodes that existed before (each thread numbers the nodes it
// creates; gradient accumulators have no number), in the order met.
edge_list boundary(const std::vector<at::Tensor>& outputs, uint64_t seq_start) {
  const uint64_t thread = at::RecordFunction::currentThreadId();
  edge_list found;
  std::set<EdgeKey> found_keys;
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> stack;
  const auto visit = [&](const Edge& e) {
    if (!e.is_valid()) {
      return;
    }
    const uint64_t nr = e.function->sequence_nr();
    // Sequence numbers count per thread (backward on CUDA recomputes on the
    // device's thread): a node is the call's if this thread made it.
    const bool inside = (nr >= seq_start && nr != std::numeric_limits<uint64_t>::max() &&
                         e.function->thread_id() == thread) ||
                        (nr != std::numeric_limits<uint64_t>::max() && is_leaf_cast(*e.function));
    if (inside) {
      if (seen.insert(e.function.get()).second) {
        stack.push_back(e.function.get());
      }
    } else if (found_keys.insert(key(e)).second) {
      found.push_back(e);
    }
  };
  for (const auto& out : outputs) {
    if (out.defined() && out.requires_grad()) {
      visit(torch::autograd::impl::gradient_edge(out));
    }
  }
  while (!stack.empty()) {
    const Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) {
      visit(e);
    }
  }
  return found;
}

// The function's inputs as it sees them: detached, requiring grad where the
// caller's did. The recomputed graph then ends at their accumulators, which
// backward captures (an input's own history belongs to the outer backward).
std::vector<at::Tensor> detach_inputs(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> out;
  out.reserve(inputs.size());
  for (const auto& t : inputs) {
    if (!t.defined()) {
      out.emplace_back();
      continue;
    }
    auto d = t.detach();
    d.requires_grad_(t.requires_grad());
    out.push_back(std::move(d));
  }
  return out;
}

// Which detached input's accumulator a boundary edge is; -1 for none.
int64_t input_of(const Edge& e, const std::vector<at::Tensor>& detached) {
  for (const auto i : c10::irange(detached.size())) {
    if (detached[i].defined() && detached[i].requires_grad() &&
        torch::autograd::impl::try_get_grad_accumulator(detached[i]).get() == e.function.get()) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// Backward captures the gradients at the boundary edges; the engine runs a
// captured node anyway when another captured one lies below it, and that
// node would then run again in the outer backward. It happens only when the
// function captures a tensor requiring grad (not a leaf) whose history
// reaches another tensor the function uses: refuse it, naming the way out.
void check_no_capture_below_another(const edge_list& edges) {
  std::unordered_set<const Node*> targets;
  for (const auto& e : edges) {
    targets.insert(e.function.get());
  }
  for (const auto& e : edges) {
    if (e.function->sequence_nr() == std::numeric_limits<uint64_t>::max()) {
      continue;  // an accumulator: nothing below it
    }
    std::unordered_set<const Node*> seen{e.function.get()};
    std::vector<const Node*> stack{e.function.get()};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      for (const auto& next : n->next_edges()) {
        if (!next.is_valid() || !seen.insert(next.function.get()).second) {
          continue;
        }
        TORCH_CHECK_NOT_IMPLEMENTED(
            targets.count(next.function.get()) == 0,
            "torchamp::checkpoint: the function uses a tensor requiring grad that it did not get "
            "as an input (its grad_fn is ",
            e.function->name(),
            "), whose history reaches another tensor the function uses (through ",
            next.function->name(), "); pass that tensor as an input instead of capturing it");
        stack.push_back(next.function.get());
      }
    }
  }
}

struct OutputMeta {
  size_t index;  // in the function's outputs
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  c10::Device device;
};

// ---- the node --------------------------------------------------------------

class CheckpointBackward : public Node {
 public:
  // `inputs`: the forward's detached copies (leaves, requiring grad where
  // the caller's did, sharing their version counters), so that the node
  // holds no input's history: `x += checkpoint(f, x)` would otherwise make
  // a cycle through it. `versions`: the inputs' before the forward.
  CheckpointBackward(CheckpointFunction function, std::vector<at::Tensor> inputs,
                     std::vector<uint32_t> versions, AutocastState autocast,
                     std::optional<RngState> rng, bool check_metadata)
      : function_(std::move(function)),
        inputs_(std::move(inputs)),
        versions_(std::move(versions)),
        autocast_(autocast),
        rng_(std::move(rng)),
        check_metadata_(check_metadata) {}

  std::string name() const override { return "torchamp::CheckpointBackward"; }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    inputs_.clear();
    function_ = nullptr;  // and what it captured
    released_ = true;
  }

  // Next edges [0, edge_input_.size()) lead to inputs edge_input_[k]; the
  // rest to the tensors the function reached by itself.
  std::vector<size_t> edge_input_;
  std::vector<OutputMeta> outputs_;  // the outputs that hang off this node

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(
        mutex_);  // as generated nodes: a retained graph, two backwards
    TORCH_CHECK(!released_,
                "torchamp::checkpoint: trying to backward through the graph a second time (or "
                "directly access saved tensors after they have already been freed); specify "
                "retain_graph=true if you need to backward through the graph a second time");
    for (const auto i : c10::irange(inputs_.size())) {
      if (inputs_[i].defined()) {
        TORCH_CHECK(inputs_[i]._version() == versions_[i],
                    "one of the variables needed for gradient computation has been modified by "
                    "an inplace operation: torchamp::checkpoint's input ",
                    i, " is at version ", inputs_[i]._version(), "; expected version ",
                    versions_[i], " instead");
      }
    }
    TORCH_CHECK_NOT_IMPLEMENTED(
        !at::GradMode::is_enabled(),
        "torchamp::checkpoint: backward with create_graph=true (higher-order gradients) "
        "through a checkpointed segment is not supported; run that segment without "
        "checkpointing");
    const auto detached = detach_inputs(inputs_);
    std::vector<at::Tensor> outs;
    uint64_t seq_start = 0;
    {
      RngReplay rng(rng_);
      at::AutoGradMode grad(true);
      AutocastReplay replay(autocast_);
      seq_start = at::sequence_number::peek();
      outs = function_(detached);
    }

    edge_list roots;
    variable_list root_grads;
    for (const auto k : c10::irange(outputs_.size())) {
      const auto& meta = outputs_[k];
      TORCH_CHECK(meta.index < outs.size() && outs[meta.index].defined(),
                  "torchamp::checkpoint: the recomputation returned ", outs.size(),
                  " outputs, and no tensor at index ", meta.index,
                  " where the forward returned one that requires grad");
      const auto& out = outs[meta.index];
      if (check_metadata_) {
        TORCH_CHECK(out.sizes().vec() == meta.sizes && out.scalar_type() == meta.dtype &&
                        out.device() == meta.device,
                    "torchamp::checkpoint: recomputed output ", meta.index, " is ",
                    out.scalar_type(), out.sizes(), " on ", out.device(),
                    ", but the forward's was ", meta.dtype, at::IntArrayRef(meta.sizes), " on ",
                    meta.device, " (determinism_check=\"default\"; \"none\" skips this check)");
      }
      TORCH_CHECK(out.requires_grad(), "torchamp::checkpoint: recomputed output ", meta.index,
                  " does not require grad, but the forward's did");
      if (grads[k].defined()) {
        roots.push_back(torch::autograd::impl::gradient_edge(out));
        root_grads.push_back(grads[k]);
      }
    }

    // Where to capture: each input's edge at the recomputation's detached
    // copy of it, every other edge where the forward's left its graph. An
    // edge the forward did not have would lose its gradient.
    edge_list captures;
    captures.reserve(num_outputs());
    std::set<EdgeKey> expected;
    for (const auto k : c10::irange(num_outputs())) {
      captures.push_back(k < edge_input_.size()
                             ? torch::autograd::impl::gradient_edge(detached[edge_input_[k]])
                             : next_edge(k));
      expected.insert(key(captures.back()));
    }
    for (const auto& e : boundary(outs, seq_start)) {
      TORCH_CHECK(expected.count(key(e)) != 0 || input_of(e, detached) >= 0,
                  "torchamp::checkpoint: the recomputation reached a tensor requiring grad ",
                  "(through ", e.function->name(),
                  ") that the forward did not reach; its gradient would be lost. The function must "
                  "compute the same way twice");
    }
    if (roots.empty()) {
      return variable_list(num_outputs());
    }
    // The engine runs a captured node's tensor hooks (a parameter's
    // register_hook, retain_grad) as it captures; the outer backward runs
    // them when it reaches the node. Aside meanwhile, so they run once.
    std::vector<compat::TensorHooksAside<Node>> aside;
    aside.reserve(captures.size());
    std::unordered_set<const Node*> set_aside;
    for (const auto& e : captures) {
      if (set_aside.insert(e.function.get()).second) {
        aside.emplace_back(*e.function);
      }
    }
    return torch::autograd::Engine::get_default_engine().execute(
        roots, root_grads, /*keep_graph=*/false, /*create_graph=*/false,
        /*accumulate_grad=*/false, captures);
  }

 private:
  CheckpointFunction function_;
  std::vector<at::Tensor> inputs_;
  std::vector<uint32_t> versions_;
  AutocastState autocast_;
  std::optional<RngState> rng_;
  bool check_metadata_;
  bool released_ = false;
};

bool check_metadata(const CheckpointOptions& options) {
  return options.determinism_check() == DeterminismCheck::kDefault;
}

}  // namespace

CheckpointOptions& CheckpointOptions::determinism_check(const std::string& name) {
  TORCH_CHECK_VALUE(
      name == "default" || name == "none",
      "torchamp::checkpoint: determinism_check must be \"default\" or \"none\", got \"", name,
      "\"");
  return determinism_check(name == "default" ? DeterminismCheck::kDefault
                                             : DeterminismCheck::kNone);
}

std::vector<at::Tensor> detail::checkpoint(const CheckpointFunction& function,
                                           const std::vector<at::Tensor>& inputs,
                                           const CheckpointOptions& options) {
  TORCH_CHECK_TYPE(static_cast<bool>(function),
                   "torchamp::checkpoint: the function is empty; expected something to call");
  const bool check = check_metadata(options);
  if (!at::GradMode::is_enabled()) {
    return function(inputs);  // nothing will run backward: Python's non-reentrant form too
  }
  const auto autocast_state = AutocastState::current();
  std::optional<RngState> rng;
  if (options.preserve_rng_state()) {
    rng = capture_rng(cuda_devices(inputs));
  }

  std::vector<uint32_t> versions;
  for (const auto& t : inputs) {
    versions.push_back(t.defined() ? t._version() : 0);
  }
  const auto detached = detach_inputs(inputs);
  const uint64_t seq_start = at::sequence_number::peek();
  auto outs = function(detached);
  for (const auto i : c10::irange(inputs.size())) {
    TORCH_CHECK(!inputs[i].defined() || inputs[i]._version() == versions[i],
                "torchamp::checkpoint: the function modified its input ", i,
                " in place; its recomputation would start from the modified values (clone it "
                "inside the function first)");
  }
  // Outputs that share memory: the caller's in-place change of one would not
  // reach the other's gradient (they hang off the node separately, not as
  // views of each other). Refused rather than wrong.
  for (const auto i : c10::irange(outs.size())) {
    for (size_t j = i + 1; j < outs.size(); ++j) {
      TORCH_CHECK_NOT_IMPLEMENTED(
          !(outs[i].defined() && outs[j].defined() && outs[i].requires_grad() &&
            outs[j].requires_grad() && outs[i].is_alias_of(outs[j])),
          "torchamp::checkpoint: outputs ", i, " and ", j,
          " share memory (one is a view of the other or both of one tensor); return one of "
          "them, or a clone");
    }
  }
  const auto edges = boundary(outs, seq_start);
  if (edges.empty()) {
    return outs;  // nothing in it requires grad
  }
  // The node's next edges: the inputs' first (the caller's edge for each
  // input the function used), then the function's own.
  std::vector<size_t> edge_input;
  edge_list next_edges;
  edge_list external;
  for (const auto& e : edges) {
    const int64_t i = input_of(e, detached);
    if (i >= 0) {
      edge_input.push_back(static_cast<size_t>(i));
      next_edges.push_back(torch::autograd::impl::gradient_edge(inputs[static_cast<size_t>(i)]));
    } else {
      external.push_back(e);
    }
  }
  check_no_capture_below_another(external);
  for (auto& e : external) {
    next_edges.push_back(std::move(e));
  }

  using NodePtr = decltype(Edge::function);
  auto node = compat::make_node<CheckpointBackward, NodePtr>(
      function, detached, std::move(versions), autocast_state, std::move(rng), check);
  node->edge_input_ = std::move(edge_input);
  node->set_next_edges(std::move(next_edges));
  for (const auto j : c10::irange(outs.size())) {
    auto& out = outs[j];
    if (!out.defined() || !out.requires_grad()) {
      continue;
    }
    node->outputs_.push_back({j, out.sizes().vec(), out.scalar_type(), out.device()});
    out = out.detach();  // drops this output's share of the forward's graph
    const auto nr = node->add_input_metadata(out);
    torch::autograd::impl::set_gradient_edge(out, Edge(NodePtr(node), nr));
  }
  return outs;
}

at::Tensor checkpoint_sequential(const torch::nn::Sequential& functions, int64_t segments,
                                 const at::Tensor& input, const CheckpointOptions& options) {
  TORCH_CHECK_TYPE(!functions.is_empty(),
                   "torchamp::checkpoint_sequential: the Sequential holder is empty (nullptr)");
  const auto size = static_cast<int64_t>(functions->size());
  TORCH_CHECK_VALUE(segments >= 1,
                    "torchamp::checkpoint_sequential: segments must be at least 1, got ", segments);
  TORCH_CHECK_VALUE(segments <= size, "torchamp::checkpoint_sequential: ", segments,
                    " segments for a Sequential of ", size,
                    " modules; there can be at most one segment per module");
  const auto run = [seq = functions.ptr()](int64_t start, int64_t end, at::Tensor x) {
    for (int64_t j = start; j <= end; ++j) {
      x = (seq->begin() + j)->forward(x);
    }
    return x;
  };
  // Python's partition: segments - 1 checkpointed runs of size / segments
  // modules, then the rest without checkpointing.
  const int64_t segment_size = size / segments;
  int64_t end = -1;
  at::Tensor x = input;
  for (int64_t start = 0; start < segment_size * (segments - 1); start += segment_size) {
    end = start + segment_size - 1;
    x = detail::checkpoint(
        [run, start, end](const std::vector<at::Tensor>& xs) {
          return std::vector<at::Tensor>{run(start, end, xs[0])};
        },
        {x}, options)[0];
  }
  return run(end + 1, size - 1, x);
}

}  // namespace torchamp
