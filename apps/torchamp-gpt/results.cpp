#include "results.h"

#include "report.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace torchamp_gpt {

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

namespace {

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

}  // namespace

void report(const fs::path& out) {
  std::cout << "\n";
  print_table(out, std::cout);
  if (plot(out)) {
    std::cout << "\nplot: " << (out / "loss.png").string() << "\n";
  }
}

}  // namespace torchamp_gpt
