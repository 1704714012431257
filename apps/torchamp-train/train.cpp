#include "train.h"

#include <torchamp/autocast.h>
#include <torchamp/checkpoint.h>
#include <torchamp/config.h>
#if TORCHAMP_WITH_DISTRIBUTED
#include <torchamp/data_parallel.h>
#include <torchamp/distributed.h>
#endif
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

bool cuda_present() {
  return torch::cuda::is_available();
}

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

std::string format_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A checkpoint's scalars.
void write_int(torch::serialize::OutputArchive& a, const std::string& key, int64_t v) {
  a.write(key, c10::IValue(v));
}
void write_double(torch::serialize::OutputArchive& a, const std::string& key, double v) {
  a.write(key, c10::IValue(v));
}
int64_t read_int(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toInt();
}
double read_double(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toDouble();
}

void write_position(torch::serialize::OutputArchive& a, const Position& p) {
  write_int(a, "position/mode_index", p.mode_index);
  write_int(a, "position/step", p.step);
  write_int(a, "position/metrics_bytes", p.metrics_bytes);
  write_int(a, "position/summary_bytes", p.summary_bytes);
  a.write("position/rank_log_bytes", c10::IValue(c10::List<int64_t>(p.rank_log_bytes)));
}

Position read_position(torch::serialize::InputArchive& a) {
  Position p;
  p.mode_index = read_int(a, "position/mode_index");
  p.step = read_int(a, "position/step");
  p.metrics_bytes = read_int(a, "position/metrics_bytes");
  p.summary_bytes = read_int(a, "position/summary_bytes");
  c10::IValue logs;
  if (a.try_read("position/rank_log_bytes", logs)) {  // absent before multi-process runs
    p.rank_log_bytes = logs.toIntVector();
  }
  return p;
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

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream s;
  archive.save_to(s);
  return s.str();
}

// The learning rate of step `step` of `total` on a cosine from `lr` down to 0
// (PyTorch's CosineAnnealingLR with eta_min 0, in closed form; the Python
// comparison computes the same double).
double cosine_lr(double lr, int64_t step, int64_t total) {
  const double pi = 3.14159265358979323846;
  return lr * 0.5 * (1.0 + std::cos(pi * static_cast<double>(step) / static_cast<double>(total)));
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = group.options();
    if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
      adam->lr(lr);
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
      adamw->lr(lr);
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
      sgd->lr(lr);
    }
  }
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
  for (const auto& t : tasks()) {
    if (t.name == name) {
      return t;
    }
  }
  throw std::invalid_argument("unknown task '" + name + "'");
}

std::map<std::string, std::string> Config::to_map() const {
  std::string joined;
  for (const auto& m : modes) {
    joined += (joined.empty() ? "" : ",") + m;
  }
  return {{"task", task},
          {"epochs", std::to_string(epochs)},
          {"batch-size", std::to_string(batch_size)},
          {"lr", format_double(lr)},
          {"seed", std::to_string(seed)},
          {"init-scale", format_double(init_scale)},
          {"growth-interval", std::to_string(growth_interval)},
          {"optimizer", optimizer},
          {"fused", fused ? "1" : "0"},
          {"checkpoint-layers", checkpoint_layers ? "1" : "0"},
          {"modes", joined},
          {"data", data},
          {"parallel", parallel},
          {"world-size", std::to_string(world_size)},
          {"deterministic", deterministic ? "1" : "0"}};
}

Config Config::from_map(const std::map<std::string, std::string>& kv) {
  auto get = [&](const std::string& key) -> const std::string& {
    const auto it = kv.find(key);
    if (it == kv.end()) {
      throw std::invalid_argument("config has no '" + key + "'");
    }
    return it->second;
  };
  Config c;
  c.task = get("task");
  c.epochs = std::stoi(get("epochs"));
  c.batch_size = std::stoi(get("batch-size"));
  c.lr = std::stod(get("lr"));
  c.seed = std::stoull(get("seed"));
  c.init_scale = std::stod(get("init-scale"));
  c.growth_interval = std::stoll(get("growth-interval"));
  c.optimizer = get("optimizer");
  c.fused = get("fused") == "1";
  // Absent from the config.txt of runs before --checkpoint-layers.
  if (const auto it = kv.find("checkpoint-layers"); it != kv.end()) {
    c.checkpoint_layers = it->second == "1";
  }
  std::stringstream modes(get("modes"));
  for (std::string m; std::getline(modes, m, ',');) {
    c.modes.push_back(m);
  }
  c.data = get("data");
  // Absent from the config.txt of runs before multi-process training.
  if (const auto it = kv.find("parallel"); it != kv.end()) {
    c.parallel = it->second;
  }
  if (const auto it = kv.find("world-size"); it != kv.end()) {
    c.world_size = std::stoi(it->second);
  }
  // Runs before --deterministic ran on LibTorch's default thread count.
  c.deterministic = false;
  if (const auto it = kv.find("deterministic"); it != kv.end()) {
    c.deterministic = it->second == "1";
  }
  return c;
}

bool cpu_fp16_autocast() {
  return torchamp::autocast::is_supported(torch::kCPU, torch::kHalf);
}

std::vector<std::string> known_modes() {
  return {"fp32",        "fp16",        "fp16+scaler",        "bf16+scaler",
          "bf16-params", "fp16-params", "fp16-params+scaler", "cuda-fp16+scaler"};
}

std::vector<std::string> default_modes() {
  std::vector<std::string> modes = {"fp32", "fp16", "fp16+scaler", "bf16+scaler"};
  if (cuda_present()) {
    modes.push_back("cuda-fp16+scaler");
  }
  return modes;
}

std::vector<std::string> available_modes() {
  std::vector<std::string> modes = default_modes();
  modes.insert(modes.end(), {"bf16-params", "fp16-params", "fp16-params+scaler"});
  return modes;
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
  const auto net = initial_net(config, task);
  c10::Dict<std::string, at::Tensor> params;
  for (const auto& p : net->named_parameters()) {
    params.insert(p.key(), p.value().detach().clone());
  }
  c10::impl::GenericDict all(c10::StringType::get(), c10::AnyType::get());
  all.insert("params", params);
  all.insert("x_train", train.x);
  all.insert("y_train", train.y);
  all.insert("x_test", test.x);
  all.insert("y_test", test.y);
  all.insert("activation", task.activation);
  all.insert("cosine", task.cosine);
  const std::vector<char> bytes = torch::pickle_save(all);
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    throw std::runtime_error("cannot write " + path);
  }
}

Position read_position(const std::string& checkpoint_path) {
  torch::serialize::InputArchive a;
  a.load_from(checkpoint_path);
  return read_position(a);
}

void save_position(const std::string& checkpoint_path, const Position& position) {
  torch::serialize::OutputArchive a;
  write_position(a, position);
  save_atomically(a, checkpoint_path);
}

ModeSummary train_mode(int64_t mode_index, const Dataset& train, const Dataset& test,
                       const Config& config, const Hooks& hooks, const std::string& resume_from,
                       const Parallel& parallel) {
  const auto start = std::chrono::steady_clock::now();
  const std::string& mode = config.modes.at(static_cast<size_t>(mode_index));
  const Task& task = find_task(config.task);
  const bool fp16 = mode == "fp16" || mode == "fp16+scaler";
  const bool fp16_autocast = fp16 && cpu_fp16_autocast();
  const bool half_storage = fp16 && !fp16_autocast;
  const bool cuda = mode == "cuda-fp16+scaler";
  const bool autocast_bf16 = mode == "bf16+scaler";
  const torch::Device device = cuda ? torch::kCUDA : torch::kCPU;
  const int rank = parallel.rank();
  const bool sharded = parallel.sharded();
  // <dtype>-params: the model itself in float16/bfloat16; master weights
  // except in fp16-params (which shows what they prevent).
  const at::ScalarType param_dtype = mode.rfind("fp16-params", 0) == 0   ? at::kHalf
                                     : mode.rfind("bf16-params", 0) == 0 ? at::kBFloat16
                                                                         : at::kFloat;
  const bool low_params = param_dtype != at::kFloat;
  if (low_params && parallel.distributed()) {
    throw std::invalid_argument("mode " + mode + " runs on one process only");
  }
  const at::ScalarType storage = half_storage ? at::kHalf : low_params ? param_dtype : at::kFloat;
  reset_peak_rss();

  ModeSummary result;
  result.mode = mode;
  result.scaled = mode.find("+scaler") != std::string::npos;

  const auto net = initial_net(config, task);
  net->to(device, param_dtype);
  const std::vector<at::Tensor> params = net->parameters();
  // Sharded: this rank's optimizer holds (and steps) only the parameters it owns.
  std::vector<int> owner(params.size(), rank);
  if (sharded) {
    std::vector<int64_t> sizes;
    for (const auto& p : params) {
      sizes.push_back(p.numel());
    }
    owner = partition(sizes, parallel.world());
  }
  std::vector<at::Tensor> mine;
  for (size_t i = 0; i < params.size(); ++i) {
    if (owner[i] == rank) {
      mine.push_back(params[i]);
    }
  }
  const std::unique_ptr<torch::optim::Optimizer> optimizer_ptr =
      low_params ? make_optimizer(mine, config, mode != "fp16-params")
                 : make_optimizer(mine, config);
  torch::optim::Optimizer& optimizer = *optimizer_ptr;
  torchamp::GradScaler scaler(torchamp::GradScalerOptions()
                                  .init_scale(config.init_scale)
                                  .growth_interval(config.growth_interval)
                                  .enabled(result.scaled));
  // What this rank's own gradients said before the group agreed.
  bool found_inf_here = false;
#if TORCHAMP_WITH_DISTRIBUTED
  if (sharded) {
    // A rank sees only its shard's gradients: without agreement a rank whose
    // shard overflowed would skip alone and the ranks' scales would part.
    auto agree = torchamp::all_reduce_found_inf(parallel.group(), parallel.timeout());
    scaler.set_found_inf_reducer([agree, &found_inf_here](bool found_inf, c10::Device d) {
      found_inf_here = found_inf_here || found_inf;
      return agree(found_inf, d);
    });
  }
#endif

  const size_t n_act = static_cast<size_t>(task.hidden_layers) + 1;
  Underflow overall;
  int64_t step = 0;
  double step_seconds = 0, train_seconds = 0, earlier_seconds = 0;
  if (!resume_from.empty()) {
    torch::serialize::InputArchive a;
    a.load_from(resume_from);
    const Position saved = read_position(a);
    if (saved.mode_index == mode_index && saved.step > 0) {
      step = saved.step;
      result.skipped = read_int(a, "counters/skipped");
      overall.total = read_int(a, "counters/underflow_total");
      overall.flushed = read_int(a, "counters/underflow_flushed");
      overall.subnormal = read_int(a, "counters/underflow_subnormal");
      step_seconds = read_double(a, "times/step");
      train_seconds = read_double(a, "times/train");
      earlier_seconds = read_double(a, "times/wall");
      torch::serialize::InputArchive model, opt;
      a.read("model", model);
      net->load(model);
      if (sharded) {
        at::Tensor bytes;
        a.read("optimizer_shard/" + std::to_string(rank), bytes);
        opt.load_from(static_cast<const char*>(bytes.data_ptr()),
                      static_cast<size_t>(bytes.numel()));
      } else {
        a.read("optimizer", opt);
      }
      optimizer.load(opt);
      if (result.scaled) {
        torch::serialize::InputArchive s;
        a.read("scaler", s);
        s >> scaler;
      }
    }
  }

#if TORCHAMP_WITH_DISTRIBUTED
  // Data-parallel: the gradients are summed over the ranks during backward
  // (after a resume too: the ranks have loaded the same checkpoint, and
  // construction takes rank 0's parameters anyway).
  std::optional<torchamp::DistributedDataParallel> ddp;
  if (parallel.distributed() && !sharded) {
    ddp.emplace(net, parallel.group(),
                torchamp::DistributedDataParallelOptions().average_gradients(false));
  }
#endif

  // Every rank takes part (the bookmark and the shards' gather are
  // collectives); rank 0 writes.
  auto checkpoint = [&] {
    Position p{mode_index, step, 0, 0, {}};
    hooks.bookmark(p);
    if (rank != 0 && !sharded) {
      return;  // its optimizer is rank 0's
    }
    torch::serialize::OutputArchive opt;
    optimizer.save(opt);
    const std::vector<std::string> shards =
        sharded ? parallel.gather_to_root(archive_bytes(opt)) : std::vector<std::string>{};
    if (rank != 0) {
      return;
    }
    torch::serialize::OutputArchive a;
    write_position(a, p);
    write_int(a, "counters/skipped", result.skipped);
    write_int(a, "counters/underflow_total", overall.total);
    write_int(a, "counters/underflow_flushed", overall.flushed);
    write_int(a, "counters/underflow_subnormal", overall.subnormal);
    write_double(a, "times/step", step_seconds);
    write_double(a, "times/train", train_seconds);
    write_double(
        a, "times/wall",
        earlier_seconds +
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    torch::serialize::OutputArchive model;
    net->save(model);
    a.write("model", model);
    if (sharded) {
      for (size_t r = 0; r < shards.size(); ++r) {
        at::Tensor bytes = torch::empty({static_cast<int64_t>(shards[r].size())}, torch::kByte);
        std::memcpy(bytes.data_ptr(), shards[r].data(), shards[r].size());
        a.write("optimizer_shard/" + std::to_string(r), bytes);
      }
    } else {
      a.write("optimizer", opt);
    }
    if (result.scaled) {
      torch::serialize::OutputArchive s;
      s << scaler;
      a.write("scaler", s);
    }
    save_atomically(a, hooks.checkpoint_path);
  };

  const std::vector<std::pair<int64_t, size_t>> infs = injected_infs();
  for (const auto& inf : infs) {
    if (inf.second >= params.size()) {
      throw std::invalid_argument("TORCHAMP_TRAIN_INJECT_INF: no parameter " +
                                  std::to_string(inf.second) + " (the network has " +
                                  std::to_string(params.size()) + ")");
    }
  }
  const at::Tensor x_train = train.x.to(device), y_train = train.y.to(device);
  const at::Tensor x_test = test.x.to(device), y_test = test.y.to(device);
  auto accuracy = [&](const at::Tensor& x, const at::Tensor& y) {
    torch::NoGradGuard no_grad;
    const at::Tensor pred = net->forward(x, at::kFloat, nullptr).argmax(1);
    return pred.eq(y).to(torch::kDouble).mean().item<double>();
  };
  const int64_t n = x_train.size(0);
  const int64_t per_epoch = (n + config.batch_size - 1) / config.batch_size;
  const int64_t total = per_epoch * config.epochs;
  for (int epoch = static_cast<int>(step / per_epoch); epoch < config.epochs; ++epoch) {
    // The same batch order in every mode (and in the Python comparison).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(config.seed * 1000003 + epoch);
    const at::Tensor order = torch::randperm(n, gen, torch::kLong).to(device);
    for (int64_t b = step % per_epoch; b < per_epoch; ++b) {
      const auto train_start = std::chrono::steady_clock::now();
      const int64_t lo = b * config.batch_size, hi = std::min(n, (b + 1) * config.batch_size);
      // Data-parallel: this rank's slice of the global batch.
      const int64_t m = hi - lo, world = parallel.world();
      const at::Tensor idx = order.slice(0, lo + m * rank / world, lo + m * (rank + 1) / world);
      const at::Tensor x = x_train.index_select(0, idx), y = y_train.index_select(0, idx);
      if (task.cosine) {
        set_lr(optimizer, cosine_lr(config.lr, step, total));
      }
      net->zero_grad();  // not the optimizer's: in the sharded mode it holds only a shard
      std::vector<Underflow> stats(n_act);
      // bf16+scaler: CPU autocast (bfloat16); fp16 modes on LibTorch >= 2.2:
      // CPU autocast (float16); cuda: CUDA autocast (float16); else none.
      torchamp::autocast guard(
          device, fp16_autocast ? std::optional<at::ScalarType>(torch::kHalf) : std::nullopt,
          /*enabled=*/autocast_bf16 || fp16_autocast || cuda);
      auto forward = [&] { return net->forward(x, storage, &stats, config.checkpoint_layers); };
#if TORCHAMP_WITH_DISTRIBUTED
      const at::Tensor logits = ddp ? ddp->forward(forward) : forward();
#else
      const at::Tensor logits = forward();
#endif
      guard.exit();
      // Each rank's loss is the mean over its slice, weighted by the slice's
      // share of the global batch before backward; the ranks' gradients are
      // then summed (by DDP in the data-parallel mode, into their owners in
      // the sharded one). So every float16 activation gradient has the size
      // it has on one process, and overflows at the same scale: averaging
      // unweighted slice means (Python DDP's way) makes them N times larger.
      const at::Tensor loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y);
      const double share = static_cast<double>(idx.size(0)) / static_cast<double>(m);
      parallel.guard("gradient all-reduce", [&] {
        scaler.scale(parallel.distributed() ? loss * share : loss).backward();
      });
      // (New tensors each step where zero_grad sets them to none, LibTorch 2.x.)
      std::vector<at::Tensor> grads;
      for (const auto& p : params) {
        grads.push_back(p.grad());
      }
      // The step's loss and underflow counts, summed over the ranks with the
      // gradients (all collectives of a call are in flight together).
      at::Tensor sums = torch::empty({1 + 3 * static_cast<int64_t>(n_act)}, torch::kDouble);
      {
        auto* v = sums.data_ptr<double>();
        v[0] = loss.item<double>() * share;
        for (size_t l = 0; l < n_act; ++l) {
          v[1 + 3 * l] = static_cast<double>(stats[l].total);
          v[2 + 3 * l] = static_cast<double>(stats[l].flushed);
          v[3 + 3 * l] = static_cast<double>(stats[l].subnormal);
        }
      }
      // Sharded: the gradients, still scaled, summed into their owners.
      if (sharded) {
        parallel.reduce_to_owners(grads, owner);
      }
      // In float16 every weight and bias gradient is a sum over the batch
      // rounded to float16 (autocast's float16 matmul, or the rounding that
      // stands in for it): on one process the whole batch's sum, inf from
      // 65520 up. Here each rank rounded its slice's, and their float32 sum
      // can pass 65520 where no slice did. Rounded to float16 the same way,
      // the sum overflows where one process's does, so the scaler skips the
      // same steps at every scale.
      if (parallel.distributed() && fp16) {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < grads.size(); ++i) {
          if (owner[i] == rank) {
            grads[i].copy_(grads[i].to(at::kHalf));
          }
        }
      }
      parallel.all_reduce_sum({sums});
      for (const auto& [at_step, index] : infs) {
        if (at_step == step && result.scaled && owner[index] == rank) {
          torch::NoGradGuard no_grad;
          grads[index].view({-1})[0].fill_(std::numeric_limits<float>::infinity());
        }
      }
      found_inf_here = false;
      const auto step_start = std::chrono::steady_clock::now();
      const bool skipped_now = !scaler.step(optimizer).has_value();
      if (skipped_now) {
        ++result.skipped;
      }
      step_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      if (result.scaled) {
        scaler.update();
      }
      if (sharded && !skipped_now) {
        // Every rank skipped or none did; after a step each owner sends its parameters.
        torch::NoGradGuard no_grad;
        parallel.broadcast_from_owners(params, owner);
      }
      const double* v = sums.data_ptr<double>();
      const double loss_value = v[0];
      for (size_t l = 0; l < n_act; ++l) {
        stats[l].total = static_cast<int64_t>(v[1 + 3 * l]);
        stats[l].flushed = static_cast<int64_t>(v[2 + 3 * l]);
        stats[l].subnormal = static_cast<int64_t>(v[3 + 3 * l]);
      }
      train_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
      Underflow all;
      std::vector<double> layers;
      for (const auto& s : stats) {
        all.add(s);
        layers.push_back(s.fraction(s.flushed));
      }
      overall.add(all);
      ++step;
      const bool epoch_end = b + 1 == per_epoch;
      StepRecord rec{
          step - 1,
          epoch,
          loss_value,
          scaler.get_scale(),
          result.skipped,
          all.fraction(all.flushed),
          all.fraction(all.subnormal),
          epoch_end ? accuracy(x_test, y_test) : std::numeric_limits<double>::quiet_NaN(),
          std::move(layers),
          skipped_now,
          sharded ? found_inf_here : skipped_now};
      if (hooks.step) {
        hooks.step(mode, rec, total);
      }
      if (hooks.checkpoint_every > 0 && step % hooks.checkpoint_every == 0 && step < total) {
        checkpoint();
      }
      maybe_die_after_step();
    }
  }

  torch::NoGradGuard no_grad;
  result.final_loss =
      torch::nn::functional::cross_entropy(net->forward(x_train, at::kFloat, nullptr), y_train)
          .item<double>();
  result.test_accuracy = accuracy(x_test, y_test);
  result.final_scale = scaler.get_scale();
  result.underflow = overall.fraction(overall.flushed);
  result.subnormal = overall.fraction(overall.subnormal);
  result.seconds = earlier_seconds +
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.step_ms = step > 0 ? 1e3 * step_seconds / static_cast<double>(step) : 0.0;
  result.train_step_ms = step > 0 ? 1e3 * train_seconds / static_cast<double>(step) : 0.0;
  result.bytes_per_param = bytes_per_param(optimizer, mine);
  result.peak_rss_mb = peak_rss_mb();
  return result;
}

}  // namespace torchamp_train
