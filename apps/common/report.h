#pragma once

// Reporting, the same in every app under apps/: the results table (markdown)
// and the figures (a gnuplot script, drawn where gnuplot is installed).

#include <filesystem>
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
