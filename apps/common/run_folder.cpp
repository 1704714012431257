#include "run_folder.h"

#include "remove_tree.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace torchamp_apps {

Options read_run_options(const fs::path& dir) {
  for (const char* name : {run_files::kOptions, run_files::kOldOptions}) {
    if (fs::exists(dir / name)) {
      return read_options((dir / name).string());
    }
  }
  return {};
}

RunFolder::RunFolder(fs::path dir, Options saved)
    : dir_(std::move(dir)), saved_(std::move(saved)), found_run_(!saved_.empty()), logs_(dir_) {
  if (fs::exists(checkpoint())) {
    position_ = read_position(checkpoint());
  }
}

RunFolder RunFolder::open(const RunArgs& args, int world, const Options& options,
                          const std::string& app) {
  if (args.out.empty() && world > 1) {
    throw std::invalid_argument(
        "on more than one process give --out: every rank must open the "
        "same run folder");
  }
  return open(args.out.empty() ? fs::path(timestamped(args.default_prefix)) : fs::path(args.out),
              options, app);
}

RunFolder RunFolder::open(const fs::path& dir, const Options& options, const std::string& app) {
  if (!fs::exists(dir) || fs::is_empty(dir)) {
    return RunFolder(dir, {});
  }
  Options saved = read_run_options(dir);
  if (saved.empty()) {
    throw std::invalid_argument("--out " + dir.string() + " is neither empty nor a " + app +
                                " run folder (no " + run_files::kOptions +
                                "): give a new or empty folder");
  }
  // Both ways; a key one of them lacks reads as unset.
  if (const auto d = differing_option(saved, options, "")) {
    // The key's flag (options.txt's d_model is --d-model); `world` has none.
    std::string name = d->key == "world" ? "number of processes (world)" : "--" + d->key;
    std::replace(name.begin(), name.end(), '_', '-');
    throw std::invalid_argument("--out " + dir.string() + " holds a run whose " + name + " is " +
                                (d->a.empty() ? "unset" : d->a) + ", but this one's is " +
                                (d->b.empty() ? "unset" : d->b) +
                                ": give its options to continue it, or another --out");
  }
  return RunFolder(dir, std::move(saved));
}

RunFolder RunFolder::existing(const fs::path& dir, const std::string& app) {
  Options saved = read_run_options(dir);
  if (saved.empty()) {
    throw std::invalid_argument("--resume: no " + std::string(run_files::kOptions) + " in " +
                                dir.string() + " (not a " + app + " run folder)");
  }
  return RunFolder(dir, std::move(saved));
}

bool RunFolder::finished(std::size_t modes) const {
  return fs::exists(path(run_files::kFinished)) ||
         (holds_run() && position_.mode_index >= static_cast<int64_t>(modes));
}

bool RunFolder::report_if_finished(std::size_t modes, int rank, const std::string& app,
                                   const std::function<void()>& results) const {
  if (!finished(modes)) {
    return false;
  }
  if (rank == 0) {
    std::cout << app << ": the run in " << dir_.string() << " has finished ("
              << (modes == 1 ? std::string("its one mode")
                             : "all " + std::to_string(modes) + " modes")
              << " done); nothing to do. Its results (" << path(run_files::kSummary).string()
              << "):\n";
    results();
  }
  return true;
}

std::string RunFolder::resume_line(std::size_t modes) const {
  if (!continuing()) {
    return found_run_ ? "no checkpoint in " + dir_.string() + " yet: the run starts again\n" : "";
  }
  return "resuming at mode " + std::to_string(position_.mode_index + 1) + "/" +
         std::to_string(modes) + ", step " + std::to_string(position_.step) + " from " +
         checkpoint() + "\n";
}

RankLog RunFolder::open_rank_log(int rank, const std::string& header) const {
  RankLog log(rank_log(rank), header);
  if (continuing()) {
    log.resume(position_, rank);
  } else {
    log.start();
  }
  return log;
}

void RunFolder::start(const Options& options, const std::string& metrics_header,
                      const std::string& summary_header) {
  fs::create_directories(dir_);
  write_options(path(run_files::kOptions).string(), options);
  fs::remove(path(run_files::kOldOptions));
  fs::remove(checkpoint());
  fs::remove(path(run_files::kFinished));
  remove_tree(path(run_files::kRanks).string());  // an earlier run's, perhaps on more processes
  fs::create_directories(path(run_files::kRanks));
  logs_.start(metrics_header, summary_header);
  saved_ = options;
  position_ = Position{};
}

void RunFolder::resume() {
  if (!fs::exists(path(run_files::kOptions))) {  // a folder of the old name
    write_options(path(run_files::kOptions).string(), saved_);
    fs::remove(path(run_files::kOldOptions));
  }
  fs::create_directories(path(run_files::kRanks));
  logs_.resume(position_);
}

void RunFolder::mark_finished() {
  std::ofstream(path(run_files::kFinished)) << "1\n";
}

fs::path RunFolder::rank_log(int rank) const {
  return path(run_files::kRanks) / ("rank" + std::to_string(rank) + ".csv");
}

void RankLog::start() {
  fs::create_directories(path_.parent_path());
  std::ofstream(path_) << header_ << "\n";
  open();
}

void RankLog::resume(const Position& p, int rank) {
  if (static_cast<size_t>(rank) < p.rank_log_bytes.size() && fs::exists(path_)) {
    fs::resize_file(path_, static_cast<uintmax_t>(p.rank_log_bytes[static_cast<size_t>(rank)]));
    open();
  } else {
    start();  // a run from before rank logs
  }
}

void RankLog::append() {
  if (!fs::exists(path_)) {
    start();
  } else {
    open();
  }
}

int64_t RankLog::flush() {
  log_.flush();
  if (!log_) {
    throw std::runtime_error("cannot write " + path_.string());
  }
  return static_cast<int64_t>(fs::file_size(path_));
}

void RankLog::open() {
  log_.open(path_, std::ios::app);
  log_ << std::setprecision(9);
  if (!log_) {
    throw std::runtime_error("cannot open " + path_.string());
  }
}

}  // namespace torchamp_apps
