// torchamp-train: mixed-precision training of an MLP on the UCI handwritten
// digits, once per precision mode, to show what loss scaling does: float16
// activation gradients underflow without it, the scaled run tracks float32,
// and the scale saw-tooths.
//
// Exit codes: 0 done, 2 bad option or malformed data, 1 anything else.

#include "data.h"
#include "train.h"

#include <torch/version.h>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#ifndef TORCHAMP_TRAIN_DEFAULT_DATA
#define TORCHAMP_TRAIN_DEFAULT_DATA "data/digits.csv.gz"
#endif

namespace fs = std::filesystem;
using namespace torchamp_train;

namespace {

std::string default_out_dir() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::ostringstream s;
  s << "runs/" << std::put_time(&tm, "%Y-%m-%d_%H-%M-%S");
  return s.str();
}

// A live bar on a terminal, a plain line per epoch otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter(bool tty, int epochs) : tty_(tty), epochs_(epochs) {}

  void operator()(const std::string& mode, const StepRecord& r, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (r.step == 0) {
      start_ = now;
    }
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(r.step + 1) / elapsed : 0.0;
    const double eta = rate > 0 ? static_cast<double>(total - r.step - 1) / rate : 0.0;
    const bool last = r.step + 1 == total;
    const int64_t per_epoch = std::max<int64_t>(1, total / epochs_);
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %3d/%d  step %5lld/%lld  loss %.4f  scale %-8g  skipped %-4lld %6.0f "
                  "steps/s  ETA %3.0fs",
                  r.epoch + 1, epochs_, static_cast<long long>(r.step + 1),
                  static_cast<long long>(total), r.loss, r.scale, static_cast<long long>(r.skipped),
                  rate, eta);
    if (tty_) {
      if (r.step % 5 == 0 || last) {
        const int width = 24;
        const auto filled = static_cast<int>(width * (r.step + 1) / total);
        std::cout << "\r\033[K" << std::left << std::setw(17) << mode << "["
                  << std::string(filled, '#') << std::string(width - filled, '.') << "] " << line
                  << std::flush;
      }
      if (last) {
        std::cout << "\n";
      }
    } else if (last || (r.step + 1) % per_epoch == 0) {
      std::cout << std::left << std::setw(17) << mode << line << "\n";
    }
  }

 private:
  bool tty_;
  int epochs_;
  std::chrono::steady_clock::time_point start_;
};

// The data path when --data is not given: the repository's copy, else the
// one installed beside the program (<prefix>/share/torchamp/).
std::string default_data_path() {
  if (fs::exists(TORCHAMP_TRAIN_DEFAULT_DATA)) {
    return TORCHAMP_TRAIN_DEFAULT_DATA;
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path installed = exe.parent_path().parent_path() / "share/torchamp/digits.csv.gz";
  return !ec && fs::exists(installed) ? installed.string() : TORCHAMP_TRAIN_DEFAULT_DATA;
}

std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * f);
  return buf;
}

void print_table(std::ostream& os, const std::vector<ModeResult>& results) {
  os << "\n| mode | final train loss | test accuracy | skipped steps | final scale "
        "| fp16-flushed act. grads | fp16-subnormal act. grads | optimizer step | wall time |\n"
        "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    char row[512];
    std::snprintf(row, sizeof row,
                  "| %s | %.4f | %.2f%% | %lld | %g | %s | %s | %.3f ms | %.1f s |\n",
                  r.mode.c_str(), r.final_loss, 100.0 * r.test_accuracy,
                  static_cast<long long>(r.skipped), r.final_scale, percent(r.underflow).c_str(),
                  percent(r.subnormal).c_str(), r.step_ms, r.seconds);
    os << row;
  }
}

void write_csv(const fs::path& path, const std::vector<ModeResult>& results) {
  std::ofstream csv(path);
  csv << "step,mode,loss,scale,skipped,underflow_fraction,subnormal_fraction\n";
  csv << std::setprecision(9);
  for (const auto& r : results) {
    for (const auto& s : r.steps) {
      csv << s.step << "," << r.mode << "," << s.loss << "," << s.scale << "," << s.skipped << ","
          << s.underflow << "," << s.subnormal << "\n";
    }
  }
  if (!csv) {
    throw std::runtime_error("cannot write " + path.string());
  }
}

// One gnuplot data block per mode (gnuplot's 'index').
bool plot(const fs::path& out, const std::vector<ModeResult>& results) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    return false;
  }
  const fs::path data = out / "plot-data.txt";
  {
    std::ofstream d(data);
    d << std::setprecision(9);
    for (const auto& r : results) {
      d << "# " << r.mode << "\n";
      for (const auto& s : r.steps) {
        d << s.step << " " << s.loss << " " << s.scale << " " << s.underflow << "\n";
      }
      d << "\n\n";
    }
  }
  std::ostringstream script;
  script << "set terminal pngcairo size 1000,560 font 'sans,11'\n"
         << "set grid\nset key top right\nset xlabel 'step'\n"
         << "set output '" << (out / "loss.png").string() << "'\n"
         << "set title 'Training loss per step (digits, MLP 64-128-128-128-10)'\n"
         << "set ylabel 'cross-entropy (batch)'\nset logscale y\nplot ";
  for (size_t i = 0; i < results.size(); ++i) {
    script << (i ? ", " : "") << "'" << data.string() << "' index " << i
           << " using 1:2 with lines lw 1.5 title '" << results[i].mode << "'";
  }
  script << "\nset output '" << (out / "scale.png").string() << "'\n"
         << "set title 'Loss scale per step (the sawtooth)'\n"
         << "set ylabel 'scale'\nset logscale y 2\nset format y '2^{%L}'\nplot ";
  bool any = false;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].scaled) {
      script << (any ? ", " : "") << "'" << data.string() << "' index " << i
             << " using 1:3 with steps lw 1.5 title '" << results[i].mode << "'";
      any = true;
    }
  }
  if (!any) {
    script << "0 notitle";
  }
  script
      << "\nset output '" << (out / "underflow.png").string() << "'\n"
      << "set title 'Activation-gradient entries that are zero in float16 (fp32/bf16: would be)'\n"
      << "set ylabel 'share of all entries'\nunset logscale y\nset format y '%.0f%%'\n"
      << "plot ";
  for (size_t i = 0; i < results.size(); ++i) {
    script << (i ? ", " : "") << "'" << data.string() << "' index " << i
           << " using 1:($4*100) with lines lw 1.5 title '" << results[i].mode << "'";
  }
  script << "\n";
  const fs::path gp = out / "plots.gp";
  std::ofstream(gp) << script.str();
  const int rc = std::system(("gnuplot '" + gp.string() + "'").c_str());
  fs::remove(data);
  return rc == 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "torchamp-train: mixed-precision training on the UCI handwritten digits, once per "
      "precision mode, comparing float32, float16 without and with loss scaling, and bfloat16."};
  Config config;
  std::string data_path = default_data_path();
  std::string out_dir;
  std::vector<std::string> modes = available_modes();
  int64_t seed = 0;
  app.add_option("--epochs", config.epochs, "Epochs per mode")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch-size", config.batch_size, "Mini-batch size")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--lr", config.lr, "Learning rate (default 0.05 for SGD, 0.003 for AdamW)")
      ->check(CLI::PositiveNumber);
  app.add_option("--optimizer", config.optimizer, "sgd (momentum 0.9) or adamw (weight decay 1e-4)")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_flag("--fused", config.fused,
               "torchamp::optim's fused optimizer (the scaler unscales inside its update) "
               "instead of LibTorch's");
  app.add_option("--modes", modes, "Modes to run, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(known_modes()))
      ->capture_default_str();
  app.add_option("--seed", seed, "Seed of the split, initial weights and batch order")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--out", out_dir, "Output folder (default runs/<date-time>/)");
  app.add_option("--init-scale", config.init_scale, "GradScaler initial scale")
      ->check(CLI::PositiveNumber)
      ->check(CLI::Range(1e-38, 3.4e38))
      ->capture_default_str();
  app.add_option("--growth-interval", config.growth_interval,
                 "GradScaler growth interval (clean steps before the scale doubles)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--data", data_path, "CSV (optionally .gz): 64 pixel columns 0..16, then label")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  config.seed = static_cast<uint64_t>(seed);
  if (app.count("--lr") == 0 && config.optimizer == "adamw") {
    config.lr = 0.003;
  }
  const std::vector<std::string> here = available_modes();
  for (const auto& m : modes) {
    if (std::find(here.begin(), here.end(), m) == here.end()) {
      std::cerr << "--modes: " << m << " needs a CUDA build of LibTorch and a GPU\n";
      return 2;
    }
  }

  try {
    const Dataset all = load_digits(data_path);
    const auto [train, test] = split(all, 0.2, config.seed);
    const fs::path out = out_dir.empty() ? fs::path(default_out_dir()) : fs::path(out_dir);
    fs::create_directories(out);
    std::cout << "torchamp-train: " << train.x.size(0) << " training and " << test.x.size(0)
              << " test images from " << data_path << "; " << config.epochs << " epochs, batch "
              << config.batch_size << ", " << (config.fused ? "torchamp's fused " : "LibTorch's ")
              << config.optimizer << ", lr " << config.lr << ", seed " << config.seed
              << "; output in " << out.string() << "\n";
    std::cout << "LibTorch " << TORCH_VERSION << ": the fp16 modes "
              << (cpu_fp16_autocast() ? "run under CPU float16 autocast (matmuls in float16)"
                                      : "store activations in float16 between layers (no CPU "
                                        "float16 autocast before LibTorch 2.2)")
              << "\n";

    ProgressPrinter printer(isatty(STDOUT_FILENO) != 0, config.epochs);
    std::vector<ModeResult> results;
    for (const auto& mode : modes) {
      results.push_back(train_mode(
          mode, train, test, config,
          [&](const std::string& m, const StepRecord& r, int64_t total) { printer(m, r, total); }));
    }
    print_table(std::cout, results);
    write_csv(out / "metrics.csv", results);
    std::cout << "\nwrote " << (out / "metrics.csv").string() << "\n";
    if (plot(out, results)) {
      std::cout << "wrote " << (out / "loss.png").string() << ", " << (out / "scale.png").string()
                << " and " << (out / "underflow.png").string() << "\n";
    } else {
      std::cout << "gnuplot not found (Debian: apt-get install gnuplot-nox): no plots, the CSV "
                   "has everything\n";
    }
    return 0;
  } catch (const DataError& e) {
    std::cerr << "--data: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
