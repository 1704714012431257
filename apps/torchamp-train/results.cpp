#include "results.h"

#include "report.h"

#include <filesystem>
#include <iostream>
#include <string>

namespace fs = std::filesystem;

namespace torchamp_train {

// summary.csv: a row per finished mode.
const torchamp_apps::Columns<ModeResult> kSummary{{"mode", &ModeResult::mode},
                                                  {"scaled", &ModeResult::scaled},
                                                  {"final_loss", &ModeResult::final_loss},
                                                  {"test_accuracy", &ModeResult::test_accuracy},
                                                  {"skipped", &ModeResult::skipped},
                                                  {"final_scale", &ModeResult::final_scale},
                                                  {"underflow", &ModeResult::underflow},
                                                  {"subnormal", &ModeResult::subnormal},
                                                  {"seconds", &ModeResult::seconds},
                                                  {"step_ms", &ModeResult::step_ms},
                                                  {"train_step_ms", &ModeResult::train_step_ms},
                                                  {"bytes_per_param", &ModeResult::bytes_per_param},
                                                  {"peak_rss_mb", &ModeResult::peak_rss_mb}};

std::vector<ModeResult> read_summaries(torchamp_apps::RunLogs& logs) {
  return kSummary.read_all(logs.summary_rows());
}

namespace {

std::string percent(double f) {
  return torchamp_apps::format("%.2f%%", 100.0 * f);
}

}  // namespace

void print_table(std::ostream& os, const std::vector<ModeResult>& results) {
  using torchamp_apps::format;
  torchamp_apps::Table table({"mode", "final train loss", "test accuracy", "skipped steps",
                              "final scale", "fp16-flushed act. grads", "fp16-subnormal act. grads",
                              "optimizer step", "training step", "wall time", "bytes/param",
                              "peak RSS"});
  for (const auto& r : results) {
    table.add({r.mode, format("%.4f", r.final_loss), percent(r.test_accuracy),
               std::to_string(r.skipped), format("%g", r.final_scale), percent(r.underflow),
               percent(r.subnormal), format("%.3f ms", r.step_ms),
               format("%.3f ms", r.train_step_ms), format("%.1f s", r.seconds),
               format("%.1f", r.bytes_per_param), format("%.0f MB", r.peak_rss_mb)});
  }
  os << "\n";
  table.print(os);
}

namespace {

// The plots' data from metrics.csv's rows, a block a mode: steps (step loss
// scale underflow skipped-here layers...) and epochs (epoch test-accuracy).
void write_plot_data(const fs::path& steps_data, const fs::path& epochs_data, size_t layers,
                     const std::vector<std::vector<std::string>>& rows,
                     const std::vector<std::string>& modes) {
  std::string mode, skipped_before;
  torchamp_apps::write_mode_blocks(steps_data, rows, 1, modes, [&](const auto& v) {
    if (v.size() < 9 + layers) {
      return std::string();
    }
    if (v[1] != mode) {
      mode = v[1];
      skipped_before = "0";
    }
    std::string line =
        v[0] + " " + v[2] + " " + v[3] + " " + v[5] + " " + (v[4] != skipped_before ? "1" : "0");
    for (size_t l = 0; l < layers; ++l) {
      line += " " + v[9 + l];
    }
    skipped_before = v[4];
    return line;
  });
  torchamp_apps::write_mode_blocks(epochs_data, rows, 1, modes, [&](const auto& v) {
    return v.size() < 9 + layers || v[8].empty() ? std::string()
                                                 : std::to_string(std::stoi(v[7]) + 1) + " " + v[8];
  });
}

// loss.png, scale.png, accuracy.png, underflow.png, underflow-layers.png.
bool plot(const fs::path& out, const Config& config,
          const std::vector<std::vector<std::string>>& rows,
          const std::vector<ModeResult>& results) {
  const Task& task = find_task(config.task);
  const std::vector<std::string> layers = activation_names(task);
  const fs::path steps_data = out / "plot-steps.txt", epochs_data = out / "plot-epochs.txt";
  std::vector<std::string> modes;
  for (const auto& r : results) {
    modes.push_back(r.mode);
  }
  write_plot_data(steps_data, epochs_data, layers.size(), rows, modes);
  const std::string d = "'" + steps_data.string() + "'";
  torchamp_apps::Figures figures(out, "set grid\nset key top right\nset xlabel 'step'\n");
  figures.figure("loss.png", "set title 'Training loss per step (" + task.name + ": " +
                                 task.summary.substr(0, 40) +
                                 "...)' noenhanced\nset ylabel 'cross-entropy (batch)'\n"
                                 "set logscale y\n");
  figures.each_mode(steps_data, modes, "1:2");
  figures.figure("scale.png",
                 "set title 'Loss scale per step (the sawtooth); crosses: skipped steps'\n"
                 "set ylabel 'scale'\nset logscale y 2\nset format y '2^{%L}'\n");
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].scaled) {
      const std::string block = d + " index " + std::to_string(i), lc = std::to_string(i + 1);
      figures.series(block + " using 1:3 with steps lw 1.5 lc " + lc + " title '" +
                     results[i].mode + "' noenhanced");
      figures.series(block + " using 1:($5 > 0 ? $3 : NaN) with points pt 2 ps 1.5 lc " + lc +
                     " notitle");
    }
  }
  figures.figure("accuracy.png",
                 "set title 'Test accuracy after each epoch'\nset xlabel 'epoch'\n"
                 "set ylabel 'test accuracy'\nunset logscale y\nset format y '%.0f%%'\n"
                 "set key bottom right\n");
  figures.each_mode(epochs_data, modes, "1:($2*100)");
  figures.figure("underflow.png",
                 "set title 'Activation-gradient entries that are zero in float16 (fp32/bf16: "
                 "would be)'\nset xlabel 'step'\nset key top right\n"
                 "set ylabel 'share of all entries'\n");
  figures.each_mode(steps_data, modes, "1:($4*100)");
  // Per layer, for the float16 modes.
  figures.figure("underflow-layers.png",
                 "set title 'Per activation: entries of its gradient zero in float16 (solid: "
                 "fp16, dashed: fp16+scaler)'\nset key outside right\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const bool scaled = results[i].mode == "fp16+scaler";
    if (results[i].mode != "fp16" && !scaled) {
      continue;
    }
    for (size_t l = 0; l < layers.size(); ++l) {
      figures.series(d + " index " + std::to_string(i) + " using 1:($" + std::to_string(6 + l) +
                     "*100) with lines lw 1.2 lc " + std::to_string(l + 1) +
                     (scaled ? " dt 2" : "") + " title '" + layers[l] +
                     (scaled ? " (scaled)" : "") + "' noenhanced");
    }
  }
  return figures.draw("plots.gp", {steps_data, epochs_data});
}

}  // namespace

void report(torchamp_apps::RunFolder& folder, const Config& config) {
  const std::vector<ModeResult> results = read_summaries(folder.logs());
  print_table(std::cout, results);
  std::cout << "\nwrote " << folder.path(torchamp_apps::run_files::kMetrics).string() << " and "
            << torchamp_apps::run_files::kSummary << "\n";
  if (plot(folder.dir(), config, folder.logs().metrics_rows(), results)) {
    std::cout << "wrote loss.png, scale.png, accuracy.png, underflow.png and "
                 "underflow-layers.png there\n";
  } else {
    std::cout << "gnuplot not found (Debian: apt-get install gnuplot-nox): no plots, the CSV "
                 "has everything\n";
  }
}

}  // namespace torchamp_train
