#include "report.h"

#include "support.h"

#include <cstdarg>
#include <cstdio>
#include <fstream>

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
