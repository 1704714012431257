#include "train.h"

#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>
#include <torchamp/config.h>
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace torchamp_train {
namespace {

// How many of a gradient's entries are zero in float16 (underflowed: "flushed"),
// and how many are subnormal there (below 2^-14, float16's smallest normal),
// out of all entries. For a float32 or bfloat16 gradient this is what float16
// would do to it; for a float16 one (real float16 autocast) what it did.
struct Underflow {
  int64_t total = 0, flushed = 0, subnormal = 0;
  void add(const at::Tensor& grad) {
    const at::Tensor h = grad.detach().to(at::kHalf).to(at::kFloat);
    total += h.numel();
    flushed += h.eq(0).sum().item<int64_t>();
    subnormal += h.ne(0).logical_and(h.abs().lt(6.103515625e-05)).sum().item<int64_t>();
  }
  void add(const Underflow& other) {
    total += other.total;
    flushed += other.flushed;
    subnormal += other.subnormal;
  }
  double fraction(int64_t n) const {
    return total == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(total);
  }
};

// What a step measures on its rank and the group sums: the rank's loss
// (weighted by its share of the batch) and each activation's underflow
// counts. It travels as one float64 tensor, in the gradients' collectives.
struct StepStats {
  double loss = 0;
  std::vector<Underflow> layers;

  at::Tensor pack() const {
    std::vector<double> v{loss};
    for (const auto& u : layers) {
      v.insert(v.end(), {static_cast<double>(u.total), static_cast<double>(u.flushed),
                         static_cast<double>(u.subnormal)});
    }
    at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kDouble);
    std::copy(v.begin(), v.end(), t.data_ptr<double>());
    return t;
  }
  /// The same fields read back from pack()'s tensor (summed in between).
  void unpack(const at::Tensor& t) {
    const double* v = t.data_ptr<double>();
    loss = *v++;
    for (auto& u : layers) {
      u.total = static_cast<int64_t>(*v++);
      u.flushed = static_cast<int64_t>(*v++);
      u.subnormal = static_cast<int64_t>(*v++);
    }
  }
};

// An MLP 64 -> width x hidden_layers -> 10. In the fp16 modes on a LibTorch
// without CPU float16 autocast (< 2.2) every Linear's weight, bias and output
// and every activation are rounded to float16, so their gradients are
// float16 on the way back, as under float16 autocast (the arithmetic itself
// is float32); from 2.2 on the fp16 modes run under real float16 autocast.
struct Net : torch::nn::Module {
  explicit Net(const Task& task) : sigmoid(task.activation == "sigmoid") {
    int64_t in = 64;
    for (int i = 0; i < task.hidden_layers; ++i) {
      layers.push_back(
          register_module("fc" + std::to_string(i), torch::nn::Linear(in, task.width)));
      in = task.width;
    }
    out = register_module("out", torch::nn::Linear(in, 10));
  }

  // `storage`: the dtype activations round-trip through (float32: none).
  // `stats`: when given, one per activation, each measures its activation's
  // gradient on the way back. `checkpoint`: each hidden layer (its Linear
  // and activation) through torchamp::checkpoint, recomputed in backward;
  // the same numbers.
  at::Tensor forward(at::Tensor x, at::ScalarType storage, std::vector<Underflow>* stats,
                     bool checkpoint = false) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto hidden = [this, i, storage, stats](const at::Tensor& h) {
        const at::Tensor z = linear(layers[i], h, storage);
        return store(sigmoid ? torch::sigmoid(z) : torch::tanh(z), storage, stats, i);
      };
      x = checkpoint ? torchamp::checkpoint(hidden, x) : hidden(x);
    }
    return store(linear(out, x, storage), storage, stats, layers.size());
  }

  // Activation `index`, rounded through `storage`, its gradient measured.
  static at::Tensor store(at::Tensor a, at::ScalarType storage, std::vector<Underflow>* stats,
                          size_t index) {
    if (storage != at::kFloat) {
      a = a.to(storage).to(at::kFloat);
    }
    if (stats != nullptr && a.requires_grad()) {
      Underflow* s = &(*stats)[index];
      a.register_hook([s](const at::Tensor& g) { s->add(g); });
    }
    return a;
  }

  // With a float16 `storage`, what float16 autocast does to a Linear's
  // numbers: its weight, bias and output rounded to float16, and so (on the
  // way back) their gradients: a weight gradient too small for float16 is
  // zero. Float16/bfloat16 parameters (the <dtype>-params modes): float32
  // arithmetic on their exact values, the output rounded to `storage`; the
  // casts hand the parameters gradients of their own dtype.
  static at::Tensor linear(torch::nn::Linear& layer, const at::Tensor& x, at::ScalarType storage) {
    const bool low_params = layer->weight.scalar_type() != at::kFloat;
    if (storage == at::kFloat && !low_params) {
      return layer->forward(x);
    }
    auto round = [storage](const at::Tensor& t) { return t.to(storage).to(at::kFloat); };
    if (low_params) {
      const at::Tensor y = torch::nn::functional::linear(x, layer->weight.to(at::kFloat),
                                                         layer->bias.to(at::kFloat));
      return storage == at::kFloat ? y : round(y);
    }
    return round(torch::nn::functional::linear(x, round(layer->weight), round(layer->bias)));
  }

  bool sigmoid;
  std::vector<torch::nn::Linear> layers;
  torch::nn::Linear out{nullptr};
};

// LibTorch's optimizer, or torchamp's fused one of the same name (the same
// options either way).
// `masters`: torchamp's fused optimizer with float32 master weights (the
// <dtype>-params modes), whatever config.fused says.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<at::Tensor> params,
                                                        const Config& config,
                                                        std::optional<bool> masters = {}) {
  const bool fused = config.fused || masters.has_value();
  const auto fused_options =
      torchamp::optim::FusedOptions().master_weights(masters.value_or(false));
  if (config.optimizer == "adamw") {
    const auto options = torch::optim::AdamWOptions(config.lr).weight_decay(1e-4);
    if (fused) {
      return std::make_unique<torchamp::optim::AdamW>(std::move(params), options, fused_options);
    }
    return std::make_unique<torch::optim::AdamW>(std::move(params), options);
  }
  if (config.optimizer == "adam") {
    const auto options = torch::optim::AdamOptions(config.lr);
    if (fused) {
      return std::make_unique<torchamp::optim::Adam>(std::move(params), options, fused_options);
    }
    return std::make_unique<torch::optim::Adam>(std::move(params), options);
  }
  TORCH_CHECK_VALUE(config.optimizer == "sgd", "unknown optimizer '", config.optimizer, "'");
  const auto options = torch::optim::SGDOptions(config.lr).momentum(0.9);
  if (fused) {
    return std::make_unique<torchamp::optim::SGD>(std::move(params), options, fused_options);
  }
  return std::make_unique<torch::optim::SGD>(std::move(params), options);
}

// The network every mode starts from: the same weights for the same seed.
std::shared_ptr<Net> initial_net(const Config& config, const Task& task) {
  torch::manual_seed(config.seed);
  return std::make_shared<Net>(task);
}

// Test hook TORCHAMP_TRAIN_INJECT_INF="STEP:PARAM[,...]": in the scaled
// modes, the gradient of parameter PARAM (in net->parameters() order) gets an
// inf at step STEP, after the gradients are reduced, on every rank that
// holds that gradient (all of them, except in the sharded mode: its owner).
std::vector<std::pair<int64_t, size_t>> injected_infs() {
  std::vector<std::pair<int64_t, size_t>> out;
  const char* v = std::getenv("TORCHAMP_TRAIN_INJECT_INF");
  std::stringstream list(v != nullptr ? v : "");
  for (std::string item; std::getline(list, item, ',');) {
    const auto colon = item.find(':');
    if (colon == std::string::npos) {
      throw std::invalid_argument("TORCHAMP_TRAIN_INJECT_INF: '" + item + "' is not STEP:PARAM");
    }
    out.emplace_back(std::stoll(item.substr(0, colon)), std::stoul(item.substr(colon + 1)));
  }
  return out;
}

// The learning rate of step `step` of `total` on a cosine from `lr` down to 0
// (PyTorch's CosineAnnealingLR with eta_min 0, in closed form; the Python
// comparison computes the same double).
double cosine_lr(double lr, int64_t step, int64_t total) {
  const double pi = 3.14159265358979323846;
  return lr * 0.5 * (1.0 + std::cos(pi * static_cast<double>(step) / static_cast<double>(total)));
}

}  // namespace

const std::vector<Task>& tasks() {
  static const std::vector<Task> all = {
      {"deep",
       "64-64x6-10 sigmoid classifier, Adam lr 0.01 on a cosine, batch 128, 250 epochs: its "
       "activation gradients shrink layer by layer, float16 flushes the first layers' to zero",
       6, 64, "sigmoid", "adam", 0.01, 250, 128, true},
      {"mlp",
       "64-128x3-10 tanh MLP, SGD (momentum 0.9) lr 0.05, batch 64, 30 epochs: trains the same "
       "in float16 with or without a scaler",
       3, 128, "tanh", "sgd", 0.05, 30, 64, false},
  };
  return all;
}

const Task& find_task(const std::string& name) {
  return torchamp_apps::find_named(tasks(), name, "task");
}

// options.txt: a key per Config member (the command line's option names);
// a key the files of older runs lack reads as its `absent` value.
const torchamp_apps::Columns<Config>& config_keys() {
  static const torchamp_apps::Columns<Config> keys{
      {"task", &Config::task},
      {"epochs", &Config::epochs},
      {"batch-size", &Config::batch_size},
      {"lr", &Config::lr},
      {"seed", &Config::seed},
      {"init-scale", &Config::init_scale},
      {"growth-interval", &Config::growth_interval},
      {"optimizer", &Config::optimizer},
      {"fused", &Config::fused},
      {"checkpoint-layers", &Config::checkpoint_layers, "0"},  // before --checkpoint-layers
      {"modes", &Config::modes},
      {"data", &Config::data},
      {"parallel", &Config::parallel, "none"},  // before multi-process training
      {"world-size", &Config::world_size, "1"},
      {"deterministic", &Config::deterministic, "0"}};  // before it: LibTorch's threads
  return keys;
}

std::map<std::string, std::string> Config::to_map() const {
  return config_keys().to_options(*this);
}

Config Config::from_map(const std::map<std::string, std::string>& kv) {
  return config_keys().from_options(kv);
}

bool cpu_fp16_autocast() {
  return torchamp::autocast::is_supported(torch::kCPU, torch::kHalf);
}

std::optional<at::ScalarType> cpu_autocast_dtype(const Mode& mode) {
  if (mode.cuda) {
    return std::nullopt;
  }
  if (mode.bf16) {
    return at::kBFloat16;
  }
  if (mode.fp16 && cpu_fp16_autocast()) {
    return at::kHalf;
  }
  return std::nullopt;
}

std::vector<std::string> known_modes() {
  return torchamp_apps::names_of(modes());
}

std::vector<std::string> default_modes() {
  return torchamp_apps::names_where(modes(), [](const Mode& m) {
    return m.by_default && (!m.cuda || torch::cuda::is_available());
  });
}

std::vector<std::string> available_modes() {
  return torchamp_apps::names_where(
      modes(), [](const Mode& m) { return !m.cuda || torch::cuda::is_available(); });
}

std::vector<std::string> activation_names(const Task& task) {
  std::vector<std::string> names;
  for (int i = 0; i < task.hidden_layers; ++i) {
    names.push_back("fc" + std::to_string(i));
  }
  names.push_back("out");
  return names;
}

void save_initial(const std::string& path, const Config& config, const Dataset& train,
                  const Dataset& test) {
  const Task& task = find_task(config.task);
  c10::impl::GenericDict all(c10::StringType::get(), c10::AnyType::get());
  all.insert("params", torchamp_apps::parameters_dict(*initial_net(config, task)));
  all.insert("x_train", train.x);
  all.insert("y_train", train.y);
  all.insert("x_test", test.x);
  all.insert("y_test", test.y);
  all.insert("activation", task.activation);
  all.insert("cosine", task.cosine);
  torchamp_apps::write_pickle(path, all);
}

const std::vector<Mode>& modes() {
  using at::kBFloat16;
  using at::kFloat;
  using at::kHalf;
  // name, cuda, fp16, bf16, params, masters, scaler, by default
  static const std::vector<Mode> all = {
      {"fp32", false, false, false, kFloat, false, false, true},
      {"fp16", false, true, false, kFloat, false, false, true},
      {"fp16+scaler", false, true, false, kFloat, false, true, true},
      {"bf16+scaler", false, false, true, kFloat, false, true, true},
      // The model itself in bfloat16/float16; master weights except in
      // fp16-params, which shows what they prevent.
      {"bf16-params", false, false, false, kBFloat16, true, false, false},
      {"fp16-params", false, false, false, kHalf, false, false, false},
      {"fp16-params+scaler", false, false, false, kHalf, true, true, false},
      {"cuda-fp16+scaler", true, false, false, kFloat, false, true, true},
  };
  return all;
}

const Mode& find_mode(const std::string& name) {
  return torchamp_apps::find_named(modes(), name, "mode");
}

namespace {

// One mode's training: the network, its optimizer (or this rank's shard of
// it) and scaler, the counters a checkpoint keeps (bound once, in `state_`,
// for both checkpoint and resume), and DDP on more than one process.
class ModeRun {
 public:
  ModeRun(int64_t mode_index, const Dataset& train, const Dataset& test, const Config& config,
          const Hooks& hooks, const Parallel& parallel)
      : mode_index_(mode_index),
        config_(config),
        hooks_(hooks),
        parallel_(parallel),
        mode_(find_mode(config.modes.at(static_cast<size_t>(mode_index)))),
        task_(find_task(config.task)),
        fp16_autocast_(cpu_autocast_dtype(mode_) == at::kHalf),
        device_(mode_.cuda ? torch::kCUDA : torch::kCPU),
        rank_(parallel.rank()),
        sharded_(parallel.sharded()),
        storage_(mode_.fp16 && !fp16_autocast_ ? at::kHalf : mode_.params),
        n_act_(static_cast<size_t>(task_.hidden_layers) + 1) {
    if (mode_.params != at::kFloat && parallel.distributed()) {
      throw std::invalid_argument("mode " + mode_.name + " runs on one process only");
    }
    reset_peak_rss();
    result_.mode = mode_.name;
    result_.scaled = mode_.scaler;
    net_ = initial_net(config, task_);
    net_->to(device_, mode_.params);
    params_ = net_->parameters();
    share_out();
    optimizer_ = mode_.params != at::kFloat ? make_optimizer(mine_, config, mode_.masters)
                                            : make_optimizer(mine_, config);
    scaler_.emplace(torchamp::GradScalerOptions()
                        .init_scale(config.init_scale)
                        .growth_interval(config.growth_interval)
                        .enabled(mode_.scaler));
    if (sharded_) {
      // A rank sees only its shard's gradients: without agreement a rank
      // whose shard overflowed would skip alone and the ranks' scales would
      // part.
      auto agree = parallel.found_inf_agreement();
      scaler_->set_found_inf_reducer([agree, this](bool found_inf, c10::Device d) {
        found_inf_here_ = found_inf_here_ || found_inf;
        return agree(found_inf, d);
      });
    }
    state_.counter("skipped", result_.skipped)
        .counter("underflow_total", overall_.total)
        .counter("underflow_flushed", overall_.flushed)
        .counter("underflow_subnormal", overall_.subnormal)
        .seconds("step", step_seconds_)
        .seconds("train", train_seconds_)
        .seconds("wall", wall_seconds_)
        .model(*net_);
    if (sharded_) {
      state_.optimizer_shard(*optimizer_, rank_);
    } else {
      state_.optimizer(*optimizer_);
    }
    if (mode_.scaler) {
      state_.scaler(*scaler_);
    }
    state_.data_parallel(ddp_);
    x_train_ = train.x.to(device_);
    y_train_ = train.y.to(device_);
    x_test_ = test.x.to(device_);
    y_test_ = test.y.to(device_);
  }

  // Continues from `path` when its position is inside this mode.
  void resume(const std::string& path) {
    step_ = state_.resume(path, mode_index_);
    earlier_seconds_ = wall_seconds_;
  }

  // Data-parallel: the gradients are summed over the ranks during backward.
  // Before a resume's load, which gives the DDP the checkpoint's buckets
  // (every rank loads the same checkpoint; the DDP hooks the loaded
  // parameters at its first forward).
  void distribute() {
    if (parallel_.distributed() && !sharded_) {
      ddp_ = torchamp_apps::DataParallel(net_, parallel_.group());
    }
  }

  void run() {
    infs_ = injected_infs();
    for (const auto& inf : infs_) {
      if (inf.second >= params_.size()) {
        throw std::invalid_argument("TORCHAMP_TRAIN_INJECT_INF: no parameter " +
                                    std::to_string(inf.second) + " (the network has " +
                                    std::to_string(params_.size()) + ")");
      }
    }
    const int64_t n = x_train_.size(0);
    const int64_t per_epoch = (n + config_.batch_size - 1) / config_.batch_size;
    total_ = per_epoch * config_.epochs;
    for (int epoch = static_cast<int>(step_ / per_epoch); epoch < config_.epochs; ++epoch) {
      // The same batch order in every mode (and in the Python comparison).
      auto gen = at::make_generator<at::CPUGeneratorImpl>(config_.seed * 1000003 + epoch);
      const at::Tensor order = torch::randperm(n, gen, torch::kLong).to(device_);
      for (int64_t b = step_ % per_epoch; b < per_epoch; ++b) {
        const int64_t lo = b * config_.batch_size;
        StepRow rec = train_step(order.slice(0, lo, std::min(n, lo + config_.batch_size)));
        rec.epoch = epoch;
        if (b + 1 == per_epoch) {
          rec.test_accuracy = accuracy(x_test_, y_test_);
        }
        hooks_.after_step(rec, mode_index_, step_, total_, [this](const Position& p) { save(p); });
      }
    }
  }

  ModeResult finish() {
    torch::NoGradGuard no_grad;
    result_.final_loss =
        torch::nn::functional::cross_entropy(net_->forward(x_train_, at::kFloat, nullptr), y_train_)
            .item<double>();
    result_.test_accuracy = accuracy(x_test_, y_test_);
    result_.final_scale = scaler_->get_scale();
    result_.underflow = overall_.fraction(overall_.flushed);
    result_.subnormal = overall_.fraction(overall_.subnormal);
    result_.seconds = earlier_seconds_ + torchamp_apps::seconds_since(start_);
    const auto steps = static_cast<double>(step_);
    result_.step_ms = step_ > 0 ? 1e3 * step_seconds_ / steps : 0.0;
    result_.train_step_ms = step_ > 0 ? 1e3 * train_seconds_ / steps : 0.0;
    result_.bytes_per_param = bytes_per_param(*optimizer_, mine_);
    result_.peak_rss_mb = peak_rss_mb();
    return result_;
  }

 private:
  // Sharded: this rank's optimizer holds (and steps) only the parameters it owns.
  void share_out() {
    owner_.assign(params_.size(), rank_);
    if (sharded_) {
      std::vector<int64_t> sizes;
      for (const auto& p : params_) {
        sizes.push_back(p.numel());
      }
      owner_ = partition(sizes, parallel_.world());
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] == rank_) {
        mine_.push_back(params_[i]);
      }
    }
  }

  double accuracy(const at::Tensor& x, const at::Tensor& y) {
    torch::NoGradGuard no_grad;
    const at::Tensor pred = net_->forward(x, at::kFloat, nullptr).argmax(1);
    return pred.eq(y).to(torch::kDouble).mean().item<double>();
  }

  // bf16+scaler: CPU autocast (bfloat16); fp16 modes on LibTorch >= 2.2:
  // CPU autocast (float16); cuda: CUDA autocast (float16); else none.
  at::Tensor forward(const at::Tensor& x, std::vector<Underflow>& stats) {
    torchamp::autocast guard(
        device_, fp16_autocast_ ? std::optional<at::ScalarType>(torch::kHalf) : std::nullopt,
        /*enabled=*/mode_.bf16 || fp16_autocast_ || mode_.cuda);
    auto forward = [&] { return net_->forward(x, storage_, &stats, config_.checkpoint_layers); };
    return ddp_.forward(forward, true);
  }

  // The gradients (new tensors each step where zero_grad sets them to none,
  // LibTorch 2.x), reduced where the run is on more than one process; the
  // step's loss and underflow counts summed over the ranks in `sums`.
  std::vector<at::Tensor> reduce(at::Tensor& sums) {
    std::vector<at::Tensor> grads;
    for (const auto& p : params_) {
      grads.push_back(p.grad());
    }
    // Sharded: the gradients, still scaled, summed into their owners.
    if (sharded_) {
      parallel_.reduce_to_owners(grads, owner_);
    }
    // In float16 every weight and bias gradient is a sum over the batch
    // rounded to float16 (autocast's float16 matmul, or the rounding that
    // stands in for it): on one process the whole batch's sum, inf from
    // 65520 up. Here each rank rounded its slice's, and their float32 sum
    // can pass 65520 where no slice did. Rounded to float16 the same way,
    // the sum overflows where one process's does, so the scaler skips the
    // same steps at every scale.
    if (parallel_.distributed() && mode_.fp16) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < grads.size(); ++i) {
        if (owner_[i] == rank_) {
          grads[i].copy_(grads[i].to(at::kHalf));
        }
      }
    }
    parallel_.all_reduce_sum({sums});
    for (const auto& [at_step, index] : infs_) {
      if (at_step == step_ && mode_.scaler && owner_[index] == rank_) {
        torch::NoGradGuard no_grad;
        grads[index].view({-1})[0].fill_(std::numeric_limits<float>::infinity());
      }
    }
    return grads;
  }

  // One optimizer step over the global batch `batch` (indices into the
  // training set); this rank trains on its slice.
  StepRow train_step(const at::Tensor& batch) {
    const auto train_start = std::chrono::steady_clock::now();
    // Data-parallel: this rank's slice of the global batch.
    const int64_t m = batch.size(0), world = parallel_.world();
    const at::Tensor idx = batch.slice(0, m * rank_ / world, m * (rank_ + 1) / world);
    const at::Tensor x = x_train_.index_select(0, idx), y = y_train_.index_select(0, idx);
    if (task_.cosine) {
      torchamp_apps::set_lr(*optimizer_, cosine_lr(config_.lr, step_, total_));
    }
    net_->zero_grad();  // not the optimizer's: in the sharded mode it holds only a shard
    StepStats stats{0, std::vector<Underflow>(n_act_)};
    const at::Tensor logits = forward(x, stats.layers);
    // Each rank's loss is the mean over its slice, weighted by the slice's
    // share of the global batch before backward; the ranks' gradients are
    // then summed (by DDP in the data-parallel mode, into their owners in
    // the sharded one). So every float16 activation gradient has the size
    // it has on one process, and overflows at the same scale: averaging
    // unweighted slice means (Python DDP's way) makes them N times larger.
    const at::Tensor loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y);
    const double share = static_cast<double>(idx.size(0)) / static_cast<double>(m);
    parallel_.guard("gradient all-reduce", [&] {
      scaler_->scale(parallel_.distributed() ? loss * share : loss).backward();
    });
    // The step's loss and underflow counts, summed over the ranks with the
    // gradients (all collectives of a call are in flight together).
    stats.loss = loss.item<double>() * share;
    at::Tensor sums = stats.pack();
    reduce(sums);
    found_inf_here_ = false;
    const auto step_start = std::chrono::steady_clock::now();
    const bool skipped_now = !scaler_->step(*optimizer_).has_value();
    if (skipped_now) {
      ++result_.skipped;
    }
    step_seconds_ += torchamp_apps::seconds_since(step_start);
    if (mode_.scaler) {
      scaler_->update();
    }
    if (sharded_ && !skipped_now) {
      // Every rank skipped or none did; after a step each owner sends its parameters.
      torch::NoGradGuard no_grad;
      parallel_.broadcast_from_owners(params_, owner_);
    }
    stats.unpack(sums);
    train_seconds_ += torchamp_apps::seconds_since(train_start);
    Underflow all;
    std::vector<double> layers;
    for (const auto& s : stats.layers) {
      all.add(s);
      layers.push_back(s.fraction(s.flushed));
    }
    overall_.add(all);
    ++step_;
    return StepRow{step_ - 1,
                   0,
                   stats.loss,
                   scaler_->get_scale(),
                   result_.skipped,
                   all.fraction(all.flushed),
                   all.fraction(all.subnormal),
                   std::numeric_limits<double>::quiet_NaN(),
                   std::move(layers),
                   skipped_now,
                   sharded_ ? found_inf_here_ : skipped_now,
                   mode_.name,
                   total_};
  }

  // A checkpoint at `p` (bookmarked): every rank takes part (the shards'
  // gather is a collective); rank 0 writes.
  void save(const Position& p) {
    if (rank_ != 0 && !sharded_) {
      return;  // its optimizer is rank 0's
    }
    const std::vector<std::string> shards =
        sharded_ ? parallel_.gather_to_root(state_.optimizer_bytes()) : std::vector<std::string>{};
    if (rank_ != 0) {
      return;
    }
    wall_seconds_ = earlier_seconds_ + torchamp_apps::seconds_since(start_);
    state_.save(hooks_.checkpoint_path, p, shards);
  }

  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  const int64_t mode_index_;
  const Config& config_;
  const Hooks& hooks_;
  const Parallel& parallel_;
  const Mode& mode_;
  const Task& task_;
  const bool fp16_autocast_;
  const torch::Device device_;
  const int rank_;
  const bool sharded_;
  const at::ScalarType storage_;  // what activations round-trip through
  const size_t n_act_;

  ModeResult result_;
  std::shared_ptr<Net> net_;
  std::vector<at::Tensor> params_, mine_;
  std::vector<int> owner_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::optional<torchamp::GradScaler> scaler_;
  torchamp_apps::DataParallel ddp_;  // data-parallel: the gradients summed in backward
  bool found_inf_here_ = false;      // this rank's own gradients, before the group agreed
  std::vector<std::pair<int64_t, size_t>> infs_;
  at::Tensor x_train_, y_train_, x_test_, y_test_;

  // What a checkpoint keeps, bound in `state_`.
  Underflow overall_;
  int64_t step_ = 0, total_ = 0;
  double step_seconds_ = 0, train_seconds_ = 0, wall_seconds_ = 0, earlier_seconds_ = 0;
  torchamp_apps::RunState state_;
};

}  // namespace

ModeResult train_mode(int64_t mode_index, const Dataset& train, const Dataset& test,
                      const Config& config, const Hooks& hooks, const std::string& resume_from,
                      const Parallel& parallel) {
  ModeRun run(mode_index, train, test, config, hooks, parallel);
  run.distribute();
  run.resume(resume_from);
  run.run();
  return run.finish();
}

}  // namespace torchamp_train
