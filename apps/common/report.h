#pragma once

// Reporting, the same in every app under apps/: the results table (markdown)
// and the figures (a gnuplot script, drawn where gnuplot is installed).

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace torchamp_apps {

/// printf into a string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

/// A markdown table: its header, then a row at a time.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  /// "| a | b |", "|---|---|", then a line a row.
  void print(std::ostream& os) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

/// A mode's progress on standard output: on a terminal one live line (the
/// mode, a bar and the app's text), redrawn every `redraw` steps and ended at
/// the mode's last step; elsewhere a plain line (the mode and the text) at the
/// steps the app marks due. The rate and the time left count from where this
/// process started the mode (a resumed mode starts mid-way).
class Progress {
 public:
  Progress(bool tty, int64_t redraw) : tty_(tty), redraw_(redraw) {}
  /// Step `step` (0-based) of `total` of `mode`; a new mode restarts the clock.
  void at(const std::string& mode, int64_t step, int64_t total);
  /// Steps a second, and seconds left at that rate, since the mode started here.
  double steps_per_s() const;
  double eta_s() const;
  /// Shows `text` for the step given to at(): a due step always prints.
  void show(const std::string& text, bool due) const;

 private:
  bool tty_;
  int64_t redraw_;
  std::string mode_;
  int64_t first_ = 0, step_ = 0, total_ = 0;
  std::chrono::steady_clock::time_point start_, now_;
};

/// gnuplot data blocks, one a mode of `modes` in its order (a figure's
/// "index i"), from CSV rows whose column `mode_column` names their mode:
/// each row's `line` (an empty one is left out), blocks apart by two blank
/// lines.
void write_mode_blocks(const std::filesystem::path& file,
                       const std::vector<std::vector<std::string>>& rows, size_t mode_column,
                       const std::vector<std::string>& modes,
                       const std::function<std::string(const std::vector<std::string>&)>& line);

/// PNG figures drawn by one gnuplot script into a run folder: each figure is
/// its settings (title, labels, scales: gnuplot lines) and a plot of series.
class Figures {
 public:
  /// `common`: gnuplot lines every figure shares (after the terminal's).
  Figures(std::filesystem::path dir, const std::string& common);
  /// The next figure, into dir/png.
  Figures& figure(const std::string& png, const std::string& settings);
  /// One series of the current figure (gnuplot's "'file' index i using 1:2
  /// with lines ..."); a figure without one plots nothing ("0 notitle").
  Figures& series(const std::string& spec);
  /// A series a block of `data` (write_mode_blocks' file), titled by its
  /// mode: "'data' index i using `using` with lines lw 1.5`style` title 'mode'".
  Figures& each_mode(const std::filesystem::path& data, const std::vector<std::string>& modes,
                     const std::string& using_, const std::string& style = "");
  /// Writes dir/script and runs gnuplot on it, then removes `scratch` (the
  /// data files the series read). False without gnuplot or when it fails.
  bool draw(const std::string& script, const std::vector<std::filesystem::path>& scratch);

 private:
  void close_figure();
  std::filesystem::path dir_;
  std::ostringstream script_;
  bool open_ = false;
  bool empty_ = true;
};

}  // namespace torchamp_apps
