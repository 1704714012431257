// torchamp-gpt: a character-level GPT (nanoGPT's model) trained on the King
// James Bible once per precision mode, from the same initial weights over the
// same batches: float32, bfloat16 autocast, bfloat16 parameters with float32
// master weights, float16 autocast with a GradScaler (and CUDA's modes where
// a GPU is there). Standalone it is one process; under torchrun each rank
// takes its slice of every batch (torchamp::DistributedDataParallel).

#include "cli.h"
#include "launch.h"
#include "report.h"
#include "run_folder.h"
#include "train.h"

#include <torchamp/autocast.h>
#include <torchamp/version.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace torchamp_gpt;

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

const char* const kMetricsHeader = "mode,step,loss,val_loss,scale,skipped,lr";
// summary.csv (and the Python twin's python-summary.csv): a row per mode.
const torchamp_apps::Columns<ModeResult> kSummary{{"mode", &ModeResult::mode},
                                                  {"val_loss", &ModeResult::val_loss},
                                                  {"train_loss", &ModeResult::train_loss},
                                                  {"skipped", &ModeResult::skipped},
                                                  {"final_scale", &ModeResult::final_scale},
                                                  {"tokens_per_s", &ModeResult::tokens_per_s},
                                                  {"step_ms", &ModeResult::step_ms},
                                                  {"peak_rss_mb", &ModeResult::peak_rss_mb},
                                                  {"bytes_per_param", &ModeResult::bytes_per_param},
                                                  {"params", &ModeResult::params},
                                                  {"weights", &ModeResult::weights},
                                                  {"start_rss_mb", &ModeResult::start_rss_mb}};

using torchamp_apps::cell;
using torchamp_apps::read_csv;

// The table of one or both runs (C++ and, when python-summary.csv is there,
// Python's): mode, validation loss, tokens/s, peak memory, against float32
// and against Python; bytes a parameter (parameters, gradients and optimizer
// state).
void print_table(const fs::path& out, std::ostream& os) {
  using torchamp_apps::format;
  const auto cpp = kSummary.read_all(read_csv(out / torchamp_apps::run_files::kSummary));
  const auto py = kSummary.read_all(read_csv(out / "python-summary.csv"));
  auto find = [](const std::vector<ModeResult>& rows, const std::string& mode) {
    const auto it =
        std::find_if(rows.begin(), rows.end(), [&](const ModeResult& r) { return r.mode == mode; });
    return it == rows.end() ? nullptr : &*it;
  };
  const ModeResult* base = find(cpp, "fp32");
  std::vector<std::string> header{"mode",        "val loss", "tokens/s", "peak MB",
                                  "bytes/param", "skipped",  "vs fp32"};
  if (!py.empty()) {
    header.insert(header.end(),
                  {"Python val loss", "Python tokens/s", "Python peak MB", "vs Python"});
  }
  torchamp_apps::Table table(header);
  for (const auto& r : cpp) {
    std::vector<std::string> row{
        r.mode,
        format("%.4f", r.val_loss),
        format("%.0f", r.tokens_per_s),
        format("%.0f", r.peak_rss_mb),
        format("%.1f", r.bytes_per_param),
        std::to_string(r.skipped),
        base ? std::to_string(r.tokens_per_s / base->tokens_per_s).substr(0, 4) + "x" : "-"};
    // A captured mode against Python's eager step of the same precision.
    const std::string twin = find_mode(r.mode).graph ? r.mode.substr(0, r.mode.size() - 6) : r.mode;
    if (const ModeResult* p = find(py, twin)) {
      row.insert(row.end(), {format("%.4f", p->val_loss), format("%.0f", p->tokens_per_s),
                             format("%.0f", p->peak_rss_mb),
                             format("%.2fx", r.tokens_per_s / p->tokens_per_s)});
    } else if (!py.empty()) {
      row.insert(row.end(), {"-", "-", "-", "-"});
    }
    table.add(row);
  }
  table.print(os);
}

// The modes of CSV rows whose first column names them, in their order.
std::vector<std::string> modes_of(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::string> modes;
  for (const auto& r : rows) {
    if (!r.empty() && std::find(modes.begin(), modes.end(), r[0]) == modes.end()) {
      modes.push_back(r[0]);
    }
  }
  return modes;
}

// loss.png: the training loss per step of every mode that ran, Python's
// (where it ran) dashed.
bool plot(const fs::path& out) {
  const fs::path data[] = {out / "plot-data.txt", out / "plot-python.txt"};
  std::vector<std::string> modes[2];
  for (int python = 0; python < 2; ++python) {
    const auto rows =
        read_csv(out / (python ? "python-metrics.csv" : torchamp_apps::run_files::kMetrics));
    modes[python] = modes_of(rows);
    torchamp_apps::write_mode_blocks(data[python], rows, 0, modes[python], [](const auto& r) {
      return r.size() < 3 ? std::string() : r[1] + " " + r[2];
    });
    for (auto& m : modes[python]) {
      m += python ? " (Python)" : " (C++)";
    }
  }
  torchamp_apps::Figures figures(out, "set grid\nset key top right\n");
  figures.figure("loss.png", std::string("set title 'torchamp-gpt: training loss per step, per "
                                         "mode") +
                                 (modes[1].empty() ? "" : " (C++ solid, Python dashed)") +
                                 "'\nset xlabel 'step'\nset ylabel 'cross-entropy (batch)'\n");
  figures.each_mode(data[0], modes[0], "1:2").each_mode(data[1], modes[1], "1:2", " dt 2");
  return figures.draw("plot.gp", {data[0], data[1]});
}

void report(const fs::path& out) {
  std::cout << "\n";
  print_table(out, std::cout);
  if (plot(out)) {
    std::cout << "\nplot: " << (out / "loss.png").string() << "\n";
  }
}

struct Args {
  Config config;
  std::string size = "small";
  torchamp_apps::RunArgs run{"", "runs/gpt-"};
  std::string report_dir;
  bool list_modes = false;
  int64_t sample_chars = 200;
  int64_t log_every = 0;
  int threads = 0;
  bool cuda_graph = false;
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
  app.add_flag("--list-modes", a.list_modes,
               "Print every mode, whether it runs here, and what it is; then exit");
  app.add_option("--report", a.report_dir,
                 "Only print the table and plot of this run folder "
                 "(with Python's run where it has one)");
}

// Parses argv into `a`; returns -1 to go on, else the exit code.
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

// Throws std::invalid_argument for what makes the run impossible; nothing is
// written before this passes.
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
  if (c.min_lr > c.lr) {
    throw std::invalid_argument("--min-lr " + cell(c.min_lr) + " exceeds --lr " + cell(c.lr));
  }
}

// The skips metrics.csv counts for `mode` so far (a mode continued mid-way).
int64_t skips_so_far(torchamp_apps::RunFolder& folder, const std::string& mode) {
  int64_t n = 0;
  for (const auto& r : folder.logs().metrics_rows()) {
    if (r.size() > 5 && r[0] == mode) {
      n = std::stoll(r[5]);
    }
  }
  return n;
}

const char* const kApp = "torchamp-gpt";

// Rank 0's run folder: the options, the Python twin's inputs, and the two
// logs, new or cut back to the checkpoint's position.
void set_up(torchamp_apps::RunFolder& folder, const Config& c, int64_t vocab) {
  folder.start_or_resume(c.to_options(), kMetricsHeader, kSummary.header());
  // Not an option of the numbers: the Python twin's default thread count.
  std::ofstream(folder.path("runtime.txt")) << "threads=" << at::get_num_threads() << "\n";
  save_initial(folder.path(torchamp_apps::run_files::kInitial).string(), c, vocab);
}

// One mode's steps as they come: metrics.csv's rows and the progress, with
// the tokens/s of the steps since the last line (rank 0).
struct StepLog {
  const Config& c;
  torchamp_apps::RunLogs* logs;  // null off rank 0
  torchamp_apps::Progress& progress;
  int64_t log_every;
  int64_t skipped = 0;
  double window_s = 0;
  int64_t window_steps = 0;

  void operator()(const StepRow& r) {
    skipped += r.skipped;
    window_s += r.seconds;
    ++window_steps;
    if (logs == nullptr) {
      return;
    }
    logs->metrics() << r.mode << "," << r.step << "," << cell(r.loss) << "," << cell(r.val_loss)
                    << "," << cell(r.scale) << "," << skipped << "," << cell(r.lr) << "\n";
    const int64_t tokens = c.batch_size * c.accum * c.world * c.model.context;
    progress.at(r.mode, r.step, c.steps);
    const bool due = (r.step + 1) % log_every == 0;
    progress.show(
        torchamp_apps::format(
            "step %5lld/%lld  loss %.4f%s  %7.0f tokens/s  scale %g  skipped %lld",
            static_cast<long long>(r.step + 1), static_cast<long long>(c.steps), r.loss,
            std::isnan(r.val_loss) ? "" : ("  val " + cell(r.val_loss).substr(0, 6)).c_str(),
            static_cast<double>(window_steps * tokens) / window_s, r.scale,
            static_cast<long long>(skipped)),
        due);
    if (due || r.step + 1 == c.steps) {
      window_s = 0;
      window_steps = 0;
    }
  }
};

// Every rank's record of the weights each mode ended with (ranks/rank<r>.csv).
void log_weights(const torchamp_apps::RunFolder& folder, int rank, const ModeResult& r) {
  torchamp_apps::RankLog log(folder.rank_log(rank), "mode,weights");
  log.append();
  log.out() << r.mode << "," << r.weights << "\n";
  log.flush();
}

// What the run is, before it starts.
void print_banner(const Config& c, const Corpus& corpus, bool pinned,
                  const torchamp_apps::RunFolder& folder) {
  std::cout << "torchamp-gpt " << TORCHAMP_VERSION << ": " << corpus.train.size(0) << " + "
            << corpus.val.size(0) << " characters (" << corpus.vocab_size() << " distinct) from "
            << c.data << "; " << c.model.layers << " layers, d " << c.model.d_model << ", "
            << c.model.heads << " heads, context " << c.model.context << "; batch " << c.batch_size
            << " x " << c.accum << " x " << c.world << " rank(s); " << at::get_num_threads()
            << " thread(s)\n"
            << torchamp_apps::determinism_line(c.deterministic, pinned)
            << "\nCPU: " << torchamp_apps::cpu_half_precision_support() << "\n";
  std::cout << folder.resume_line(c.modes.size());  // a checkpoint inside a mode or between two
}

// Trains the modes from the folder's position on, every rank; rank 0 writes
// the logs and checkpoints. Returns each mode's sample (rank 0).
std::vector<std::string> train_modes(const Args& a, const Corpus& corpus, Runtime& rt,
                                     torchamp_apps::RunFolder& folder) {
  const Config& c = a.config;
  const bool root = rt.rank == 0;
  const int64_t log_every = a.log_every > 0 ? a.log_every : std::max<int64_t>(1, c.steps / 10);
  std::vector<std::string> samples;
  torchamp_apps::Progress progress(isatty(STDOUT_FILENO) != 0,
                                   std::max<int64_t>(1, log_every / 10));
  folder.run_modes<ModeResult>(
      c.modes.size(), root,
      [&](int64_t i, const std::string& from) {
        const std::string& name = c.modes[static_cast<size_t>(i)];
        const Mode& m = find_mode(name);
        if (root && m.device == c10::kCPU) {
          std::cout << torchamp_apps::slow_here(name, {m.autocast.value_or(m.params), m.params});
        }
        StepLog log{c, root ? &folder.logs() : nullptr, progress, log_every};
        log.skipped = !from.empty() && root ? skips_so_far(folder, name) : 0;
        rt.step = [&](const StepRow& r) { log(r); };
        ModeResult r = train_mode(corpus, c, i, rt, from);
        r.skipped = log.skipped;
        log_weights(folder, rt.rank, r);
        return r;
      },
      [&](const ModeResult& r) {  // summary.csv's row and its sample
        kSummary.write(folder.logs().summary(), r);
        std::ofstream(folder.path("sample-" + r.mode + ".txt")) << r.sample << "\n";
        samples.push_back(r.mode + ":\n" + r.sample);
      },
      rt.bookmark);
  return samples;
}

int train(Args& a) {
  Config& c = a.config;
  const auto env = torchamp_apps::LaunchEnv::from_environment();
  c.world = env.world;
  if (a.cuda_graph) {
    c.modes = with_graph_modes(c.modes);
  }
  check(c);
  const Corpus corpus = Corpus::load(c.data, c.model.context, c.vocab);
  auto folder = torchamp_apps::RunFolder::open(a.run, env.world, c.to_options(), kApp);
  if (folder.report_if_finished(c.modes.size(), env.rank, kApp, [&] { report(folder.dir()); })) {
    return 0;
  }
  if (a.threads > 0) {
    at::set_num_threads(a.threads);
  }
  const bool pinned = c.deterministic && torchamp_apps::pin_mkl_to_one_thread();
  Runtime rt{folder.hooks<StepRow>(a.run, env.rank == 0),
             torchamp_apps::form_group(env, a.run.timeout()), env.rank, a.sample_chars};
  if (env.rank == 0) {
    set_up(folder, c, std::max(c.vocab, corpus.vocab_size()));
  }
  print_banner(c, corpus, pinned, folder);
  const std::vector<std::string> samples = train_modes(a, corpus, rt, folder);
  if (env.rank != 0) {
    return 0;
  }
  if (a.sample_chars > 0) {
    std::cout << "\nWhat each model writes (" << a.sample_chars << " characters after a newline, "
              << "temperature 0.8):\n";
    for (const auto& s : samples) {
      std::cout << "--- " << s << "\n";
    }
  }
  report(folder.dir());
  std::cout << "\nrun folder: " << folder.dir().string() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return torchamp_apps::app_main<Args>(kApp, argc, argv, parse, [](Args& a) {
    if (a.list_modes) {
      for (const auto& m : known_modes()) {
        std::printf("%-22s %-12s %s\n", m.name.c_str(),
                    mode_available(m) ? "available" : "unavailable", m.summary.c_str());
      }
      return 0;
    }
    if (!a.report_dir.empty()) {
      report(a.report_dir);
      return 0;
    }
    return train(a);
  });
}
