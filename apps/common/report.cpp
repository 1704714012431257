#include "report.h"

#include "support.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>

namespace fs = std::filesystem;

namespace torchamp_apps {

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

void Table::print(std::ostream& os) const {
  auto line = [&os](const std::vector<std::string>& cells) {
    os << "|";
    for (const auto& cell : cells) {
      os << " " << cell << " |";
    }
    os << "\n";
  };
  line(header_);
  os << "|";
  for (size_t i = 0; i < header_.size(); ++i) {
    os << "---|";
  }
  os << "\n";
  for (const auto& row : rows_) {
    line(row);
  }
}

void Progress::at(const std::string& mode, int64_t step, int64_t total) {
  now_ = std::chrono::steady_clock::now();
  if (mode != mode_) {
    mode_ = mode;
    start_ = now_;
    first_ = step;
  }
  step_ = step;
  total_ = total;
}

double Progress::steps_per_s() const {
  const double elapsed = std::chrono::duration<double>(now_ - start_).count();
  return elapsed > 0 ? static_cast<double>(step_ + 1 - first_) / elapsed : 0.0;
}

double Progress::eta_s() const {
  const double rate = steps_per_s();
  return rate > 0 ? static_cast<double>(total_ - step_ - 1) / rate : 0.0;
}

void Progress::show(const std::string& text, bool due) const {
  const bool last = step_ + 1 == total_;
  if (!tty_) {
    if (due || last) {
      std::cout << std::left << std::setw(18) << mode_ << " " << text << std::endl;
    }
    return;
  }
  if (step_ % redraw_ == 0 || due || last) {
    const int width = 24;
    const auto filled = static_cast<int>(width * (step_ + 1) / std::max<int64_t>(1, total_));
    std::cout << "\r\033[K" << std::left << std::setw(18) << mode_ << " ["
              << std::string(filled, '#') << std::string(width - filled, '.') << "] " << text
              << std::flush;
  }
  if (last) {
    std::cout << "\n";
  }
}

void write_mode_blocks(const fs::path& file, const std::vector<std::vector<std::string>>& rows,
                       size_t mode_column, const std::vector<std::string>& modes,
                       const std::function<std::string(const std::vector<std::string>&)>& line) {
  std::ofstream out(file);
  for (const auto& mode : modes) {
    out << "# " << mode << "\n";
    for (const auto& r : rows) {
      if (r.size() > mode_column && r[mode_column] == mode) {
        const std::string l = line(r);
        if (!l.empty()) {
          out << l << "\n";
        }
      }
    }
    out << "\n\n";
  }
}

Figures::Figures(fs::path dir, const std::string& common) : dir_(std::move(dir)) {
  script_ << "set terminal pngcairo size 1000,560 font 'sans,11'\n" << common;
}

Figures& Figures::figure(const std::string& png, const std::string& settings) {
  close_figure();
  script_ << "set output '" << (dir_ / png).string() << "'\n" << settings << "plot ";
  open_ = true;
  empty_ = true;
  return *this;
}

Figures& Figures::series(const std::string& spec) {
  script_ << (empty_ ? "" : ", ") << spec;
  empty_ = false;
  return *this;
}

Figures& Figures::each_mode(const fs::path& data, const std::vector<std::string>& modes,
                            const std::string& using_, const std::string& style) {
  std::string file = "'";  // (appended: GCC 12's -O3 warns falsely on "'" + a temporary)
  file += data.string();
  file += "' index ";
  for (size_t i = 0; i < modes.size(); ++i) {
    series(file + std::to_string(i) + " using " + using_ + " with lines lw 1.5" + style +
           " title '" + modes[i] + "' noenhanced");
  }
  return *this;
}

void Figures::close_figure() {
  if (open_) {
    script_ << (empty_ ? "0 notitle" : "") << "\n";
  }
  open_ = false;
}

bool Figures::draw(const std::string& script, const std::vector<fs::path>& scratch) {
  close_figure();
  const fs::path gp = dir_ / script;
  std::ofstream(gp) << script_.str();
  const bool ok = have_gnuplot() && run_gnuplot(gp.string());
  for (const auto& file : scratch) {
    fs::remove(file);
  }
  return ok;
}

}  // namespace torchamp_apps
