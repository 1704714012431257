// torchamp-gpt: a character-level GPT (nanoGPT's model) trained on the King
// James Bible once per precision mode, from the same initial weights over the
// same batches: float32, bfloat16 autocast, bfloat16 parameters with float32
// master weights, float16 autocast with a GradScaler (and CUDA's modes where
// a GPU is there). Standalone it is one process; under torchrun each rank
// takes its slice of every batch (torchamp::DistributedDataParallel).

#include "command_line.h"
#include "launch.h"
#include "report.h"
#include "results.h"
#include "run_folder.h"
#include "train.h"

#include <torchamp/version.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

using namespace torchamp_gpt;

namespace {

using torchamp_apps::cell;

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

// metrics.csv's header, of the rows StepLog writes.
const char* const kMetricsHeader = "mode,step,loss,val_loss,scale,skipped,lr";

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
  if (a.profile_steps >= c.steps) {
    throw std::invalid_argument("--profile " + std::to_string(a.profile_steps) +
                                " leaves no step to time: it must be less than --steps " +
                                std::to_string(c.steps));
  }
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
             torchamp_apps::form_group(env, a.run.timeout()),
             env.rank,
             a.sample_chars,
             a.profile_steps,
             folder.dir().string()};
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
