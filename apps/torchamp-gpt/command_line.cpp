#include "command_line.h"

#include "cli.h"
#include "run_state.h"

#include <CLI/CLI.hpp>

#include <stdexcept>
#include <vector>

namespace torchamp_gpt {
namespace {

// Model sizes: --size picks one, the single options override it.
struct Size {
  const char* name;
  int64_t layers, heads, d_model, context, batch_size;
  const char* summary;
};
const Size kSizes[] = {
    {"tiny", 2, 2, 32, 32, 8, "2 layers, d 32, context 32: the tests' (~30K parameters)"},
    {"small", 4, 4, 128, 128, 16, "4 layers, d 128, context 128 (~0.8M parameters)"},
    {"gpt10m", 6, 6, 384, 256, 8, "6 layers, d 384, context 256 (~10.7M parameters)"},
};

// --size, and the model options that override it.
struct SizeOptions {
  int64_t layers = 0, heads = 0, d_model = 0, context = 0, batch = 0;

  void add(CLI::App& app, std::string& size) {
    std::string help = "Model size:";
    std::vector<std::string> names;
    for (const auto& s : kSizes) {
      help += std::string("\n  ") + s.name + ": " + s.summary;
      names.push_back(s.name);
    }
    app.add_option("--size", size, help)->check(CLI::IsMember(names))->capture_default_str();
    app.add_option("--layers", layers, "Transformer blocks (default: the size's)")
        ->check(CLI::Range(1, 1000));
    app.add_option("--heads", heads, "Attention heads (default: the size's)")
        ->check(CLI::Range(1, 1000));
    app.add_option("--d-model", d_model, "Embedding width (default: the size's)")
        ->check(CLI::Range(1, 100000));
    app.add_option("--context", context, "Context length in characters (default: the size's)")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    app.add_option("--batch-size", batch,
                   "Sequences per micro-batch and rank (default: the size's)")
        ->check(CLI::Range(1, 1000000));
  }

  void apply(const std::string& size, Config& c) const {
    for (const auto& s : kSizes) {
      if (size == s.name) {
        c.model.layers = layers ? layers : s.layers;
        c.model.heads = heads ? heads : s.heads;
        c.model.d_model = d_model ? d_model : s.d_model;
        c.model.context = context ? context : s.context;
        c.batch_size = batch ? batch : s.batch_size;
      }
    }
  }
};

// The options that decide the numbers (Config's, but the model's size).
void add_training_options(CLI::App& app, Config& c) {
  app.add_option("--accum", c.accum,
                 "Micro-batches per step (gradient accumulation; under "
                 "torchrun all but the last run under DDP's no_sync)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--steps", c.steps, "Optimizer steps per mode")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("--warmup", c.warmup, "Steps of linear learning-rate warmup")
      ->check(CLI::Range(0, 100000000))
      ->capture_default_str();
  app.add_option("--lr", c.lr, "Peak learning rate (cosine decay to --min-lr)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "Final learning rate")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay, on matrices only")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--clip", c.clip, "Clip the (unscaled) gradient norm to this")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--dropout", c.model.dropout, "Dropout probability")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  app.add_option("--eval-every", c.eval_every, "Validation loss every N steps (and at the end)")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("--eval-batches", c.eval_batches, "Validation micro-batches")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--vocab", c.vocab, "Embedding rows (0: the corpus's distinct characters)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  torchamp_apps::add_scaler_options(app, c.init_scale, c.growth_interval);
  app.add_option("--seed", c.seed, "Seed of the initial weights, batches and dropout")
      ->capture_default_str();
  const auto names = torchamp_apps::names_of(known_modes());
  c.modes = default_modes();
  app.add_option("--modes", c.modes,
                 "Modes to run, comma-separated (default: those available here)")
      ->delimiter(',')
      ->check(CLI::IsMember(names))
      ->capture_default_str()
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

// The options of the run around them: the corpus, the folder, threads,
// what is printed.
void add_run_options(CLI::App& app, Args& a) {
  Config& c = a.config;
  app.add_flag("--checkpoint-layers", c.model.checkpoint_layers,
               "Activation checkpointing per block (torchamp::checkpoint): less memory, more time");
  c.data = torchamp_apps::default_data("kjv.txt", torchamp_apps::built_data_path());
  app.add_option("--data", c.data, "Text file to train on")->capture_default_str();
  torchamp_apps::add_run_options(app, a.run, c.deterministic);
  app.add_option("--threads", a.threads, "ATen's threads (0: its default)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--sample", a.sample_chars, "Characters each trained model writes at the end")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--log-every", a.log_every, "Progress line every N steps (0: ten a mode)")
      ->check(CLI::Range(0, 100000000));
  app.add_flag("--cuda-graph", a.cuda_graph,
               "Each CUDA mode also once more with its step captured in a CUDA graph and "
               "replayed (its mode +graph): the same bits, the time without the launches");
  app.add_flag("--device-step", c.device_step,
               "The CPU modes take the step the CUDA modes take, with no host read: the "
               "scaler's state in tensors, ATen's fused AdamW, the rate a tensor, the norm "
               "clipped on the device (LibTorch >= 2.4, --dropout 0): that step checked "
               "without a GPU");
  app.add_option("--profile", a.profile_steps,
                 "Each mode's last N steps under LibTorch's profiler, into trace-MODE.json (a "
                 "Chrome trace; profile_report.py says where the time goes); not counted in "
                 "tokens/s")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  app.add_flag("--list-modes", a.list_modes,
               "Print every mode, whether it runs here, and what it is; then exit");
  app.add_option("--report", a.report_dir,
                 "Only print the table and plot of this run folder "
                 "(with Python's run where it has one)");
}

}  // namespace

int parse(int argc, char** argv, Args& a) {
  CLI::App app{
      "torchamp-gpt: a character-level GPT (nanoGPT's model) trained on the King James Bible "
      "in C++, once per precision mode, from the same initial weights over the same batches."};
  // An option given twice takes its last value (a script's defaults, then
  // the user's own); --modes gathers every list it is given.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  Config& c = a.config;
  SizeOptions sizes;
  sizes.add(app, a.size);
  add_training_options(app, c);
  add_run_options(app, a);
  if (const int rc = torchamp_apps::parse_command_line(app, argc, argv); rc >= 0) {
    return rc;
  }
  sizes.apply(a.size, c);
  return -1;
}

void check(const Config& c) {
  if (c.data.empty()) {
    throw std::invalid_argument(
        "no corpus: this build found no King James Bible (Debian's bible-kjv); pass --data FILE");
  }
  if (c.model.d_model % c.model.heads != 0) {
    throw std::invalid_argument("--d-model " + std::to_string(c.model.d_model) +
                                " is not a multiple of --heads " + std::to_string(c.model.heads));
  }
  if (c.modes.empty()) {
    throw std::invalid_argument("--modes names no mode");
  }
  for (const auto& name : c.modes) {
    if (!mode_available(find_mode(name))) {
      throw std::invalid_argument("mode " + name + " (" + find_mode(name).summary +
                                  ") does not run with this LibTorch on this machine");
    }
    if (find_mode(name).graph &&
        (c.model.dropout != 0 || c.world != 1 || c.model.checkpoint_layers)) {
      throw std::invalid_argument("mode " + name +
                                  " captures its step in a CUDA graph: it needs --dropout 0, one "
                                  "process and no --checkpoint-layers");
    }
  }
  if (c.device_step) {
    if (c.model.dropout != 0) {
      throw std::invalid_argument(
          "--device-step takes no dropout (the step draws no masks on "
          "the device): --dropout " +
          torchamp_apps::cell(c.model.dropout) + " given");
    }
    if (const auto why = device_step_unsupported()) {
      throw std::invalid_argument("--device-step does not run with this LibTorch: " + *why);
    }
  }
  if (c.min_lr > c.lr) {
    throw std::invalid_argument("--min-lr " + torchamp_apps::cell(c.min_lr) + " exceeds --lr " +
                                torchamp_apps::cell(c.lr));
  }
}

}  // namespace torchamp_gpt
