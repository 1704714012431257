#pragma once

// A main job's run folder and its checkpoints, shared by every app: where a
// run stands (Position), the one record of what a checkpoint holds
// (RunState: the same object writes it and reads it back, so checkpoint and
// resume cannot drift), the two logs a checkpoint cuts back to (RunLogs),
// and the CSV cells they are written in.

#include "support.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace torchamp {
class GradScaler;
}

namespace torchamp_apps {

class DataParallel;

/// The files of every app's run folder.
namespace run_files {
inline constexpr const char* kOptions = "options.txt";  // the run's settings, key=value
inline constexpr const char* kCheckpoint = "checkpoint.pt";
inline constexpr const char* kInitial = "initial.pt";   // the initial weights, for the Python twin
inline constexpr const char* kMetrics = "metrics.csv";  // a row per step
inline constexpr const char* kSummary = "summary.csv";  // a row per finished mode
inline constexpr const char* kFinished = "finished";    // written when every mode is done
inline constexpr const char* kRanks = "ranks";          // ranks/rank<r>.csv: each rank's own log
/// What torchamp-train called the options file before the apps shared one
/// folder (read, never written: such a folder still continues).
inline constexpr const char* kOldOptions = "config.txt";
}  // namespace run_files

/// Where a run stands: written into every checkpoint.
struct Position {
  int64_t mode_index = 0;     // into the run's list of modes
  int64_t step = 0;           // steps done in that mode; 0 = start it afresh
  int64_t metrics_bytes = 0;  // metrics.csv's and summary.csv's sizes at the checkpoint
  int64_t summary_bytes = 0;
  std::vector<int64_t> rank_log_bytes;  // each rank's own log, where the app keeps one
};

/// What an app's training loop reports and asks for along the way, the same
/// in every app; `Row` is its record of one step.
template <class Row>
struct Hooks {
  /// After every step, on every rank (rank 0 writes metrics.csv's row).
  std::function<void(const Row&)> step;
  /// Before a checkpoint: flush the logs and record their sizes (a
  /// collective where the run has several processes).
  std::function<void(Position&)> bookmark;
  int64_t checkpoint_every = 0;  // steps; 0: none
  std::string checkpoint_path;   // rank 0 writes it, atomically

  /// After a mode's `done`-th step of `total`, on every rank: `row` to
  /// `step`; where a checkpoint is due (every checkpoint_every steps, not
  /// after the last) the bookmark, then `save` with the position; then the
  /// test hook that may kill the process here.
  void after_step(const Row& row, int64_t mode_index, int64_t done, int64_t total,
                  const std::function<void(const Position&)>& save) const {
    if (step) {
      step(row);
    }
    if (checkpoint_every > 0 && done % checkpoint_every == 0 && done < total) {
      Position p{mode_index, done, 0, 0, {}};
      bookmark(p);
      save(p);
    }
    maybe_die_after_step();
  }
};

/// The position stored in a checkpoint file.
Position read_position(const std::string& checkpoint_path);
/// Writes a checkpoint holding only a position (between modes), atomically.
void save_position(const std::string& checkpoint_path, const Position& position);

/// What one mode's checkpoint holds beyond its position: named counters and
/// times, the model, the optimizer (whole, or one shard per rank) and the
/// scaler. Bind the variables once; save() writes them and load() reads them
/// back into the same variables.
class RunState {
 public:
  RunState& counter(std::string key, int64_t& value);
  RunState& seconds(std::string key, double& value);
  RunState& model(torch::nn::Module& model);
  RunState& optimizer(torch::optim::Optimizer& optimizer);
  /// The optimizer holds rank `rank`'s shard: save() takes every rank's
  /// bytes (gathered by the caller), load() reads this rank's.
  RunState& optimizer_shard(torch::optim::Optimizer& optimizer, int rank);
  RunState& scaler(torchamp::GradScaler& scaler);
  /// The DDP's buckets (a run on several processes): load() gives them back
  /// to it, so the resumed run adds its gradients as the uninterrupted one.
  RunState& data_parallel(DataParallel& ddp);

  /// This rank's optimizer, serialized (what a sharded save gathers).
  std::string optimizer_bytes() const;
  /// Writes `position` and everything bound to `path`, atomically; `shards`:
  /// every rank's optimizer_bytes() when the optimizer is sharded.
  void save(const std::string& path, const Position& position,
            const std::vector<std::string>& shards = {}) const;
  /// Reads everything bound from `path`; returns its position.
  Position load(const std::string& path) const;
  /// load(path) where `path` (may be empty) holds a position inside mode
  /// `mode_index`, past its start; returns the step to go on from (else 0).
  int64_t resume(const std::string& path, int64_t mode_index) const;

 private:
  std::vector<std::pair<std::string, int64_t*>> counters_;
  std::vector<std::pair<std::string, double*>> seconds_;
  torch::nn::Module* model_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;
  int shard_ = -1;  // >= 0: the optimizer is this rank's shard
  torchamp::GradScaler* scaler_ = nullptr;
  DataParallel* ddp_ = nullptr;
};

/// A run folder's two logs: metrics.csv (a row per step) and summary.csv (a
/// row per finished mode), appended as the run goes. A checkpoint records
/// their sizes (bookmark); a resume cuts them back to those.
class RunLogs {
 public:
  explicit RunLogs(std::filesystem::path dir) : dir_(std::move(dir)) {}

  std::filesystem::path path(const std::string& name) const { return dir_ / name; }
  /// New logs holding only their headers.
  void start(const std::string& metrics_header, const std::string& summary_header);
  /// The logs as they were at `p` (whatever was written after it goes).
  void resume(const Position& p);
  /// Flushes both and records their sizes in `p`.
  void bookmark(Position& p);
  std::ofstream& metrics() { return metrics_; }
  std::ofstream& summary() { return summary_; }
  /// The rows of a log (after its header), flushed first.
  std::vector<std::vector<std::string>> metrics_rows();
  std::vector<std::vector<std::string>> summary_rows();

 private:
  void open();
  std::filesystem::path dir_;
  std::ofstream metrics_, summary_;
};

/// A double as "%.17g" (what the logs hold: read back, the same double).
std::string g17(double v);
/// A log's cell for a double: g17, empty for NaN (a value a row lacks).
std::string cell(double v);
/// One CSV line's cells (a trailing comma gives a last empty cell).
std::vector<std::string> split_csv(const std::string& line);
/// A CSV file's rows after its header; none for a missing file.
std::vector<std::vector<std::string>> read_csv(const std::filesystem::path& path);
/// `prefix` followed by the local date and time, "2026-12-04_09-30-00".
std::string timestamped(const std::string& prefix);

/// A record's fields, each a member of `Row`, named once: a CSV log's
/// header, a row's line and a row read back from its cells, or a run
/// folder's options file (key=value) and a record read back from it, come
/// from the one table (doubles as cell(), integers in decimal, bools as 0/1,
/// lists joined by commas, strings as they are).
template <class Row>
class Columns {
 public:
  using Member = std::variant<std::string Row::*, double Row::*, int Row::*, int64_t Row::*,
                              uint64_t Row::*, bool Row::*, std::vector<std::string> Row::*>;
  struct Column {
    const char* name;
    Member member;
    /// For an options file: the value of a key older runs' files lack
    /// (null: the key is required).
    const char* absent = nullptr;
  };
  Columns(std::initializer_list<Column> columns) : columns_(columns) {}

  /// The options file's key=value pairs of `row`.
  std::map<std::string, std::string> to_options(const Row& row) const {
    std::map<std::string, std::string> out;
    for (const auto& c : columns_) {
      std::visit([&](auto m) { out[c.name] = text(row.*m); }, c.member);
    }
    return out;
  }
  /// The record of an options file; std::invalid_argument naming a required
  /// key it lacks or a value that does not parse.
  Row from_options(const std::map<std::string, std::string>& kv) const {
    Row row;
    for (const auto& c : columns_) {
      const auto it = kv.find(c.name);
      if (it == kv.end() && c.absent == nullptr) {
        throw std::invalid_argument(std::string("the options file has no '") + c.name + "'");
      }
      const std::string& value = it == kv.end() ? std::string(c.absent) : it->second;
      try {
        std::visit([&](auto m) { parse(value, row.*m); }, c.member);
      } catch (const std::logic_error&) {
        throw std::invalid_argument(std::string("the options file's ") + c.name + "=" + value +
                                    " does not parse");
      }
    }
    return row;
  }

  std::string header() const {
    std::string h;
    for (const auto& c : columns_) {
      h += h.empty() ? "" : ",";  // (a temporary's insert: GCC 12's -Wstringop-overflow at -O2)
      h += c.name;
    }
    return h;
  }
  /// `row`'s line, newline included.
  void write(std::ostream& os, const Row& row) const {
    for (size_t k = 0; k < columns_.size(); ++k) {
      os << (k == 0 ? "" : ",");
      std::visit([&](auto m) { os << text(row.*m); }, columns_[k].member);
    }
    os << "\n";
  }
  /// The row of `cells` (a line of the log); std::runtime_error naming the
  /// line when it has another number of cells or a cell does not parse.
  Row read(const std::vector<std::string>& cells) const {
    if (cells.size() != columns_.size()) {
      throw std::runtime_error("malformed log line (" + std::to_string(columns_.size()) +
                               " cells expected): " + text(cells));
    }
    Row row;
    try {
      for (size_t k = 0; k < columns_.size(); ++k) {
        std::visit([&](auto m) { parse(cells[k], row.*m); }, columns_[k].member);
      }
    } catch (const std::logic_error&) {  // std::stod's and std::stoll's
      throw std::runtime_error("malformed log line: " + text(cells));
    }
    return row;
  }
  std::vector<Row> read_all(const std::vector<std::vector<std::string>>& rows) const {
    std::vector<Row> out;
    for (const auto& r : rows) {
      out.push_back(read(r));
    }
    return out;
  }

 private:
  static std::string text(const std::string& v) { return v; }
  static std::string text(double v) { return cell(v); }
  template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
  static std::string text(I v) {
    return std::is_same_v<I, bool> ? (v ? "1" : "0") : std::to_string(v);
  }
  static std::string text(const std::vector<std::string>& v) {
    std::string joined;
    for (const auto& s : v) {
      joined += (joined.empty() ? "" : ",") + s;
    }
    return joined;
  }
  static void parse(const std::string& s, std::string& v) { v = s; }
  static void parse(const std::string& s, double& v) {
    v = s.empty() ? std::numeric_limits<double>::quiet_NaN() : std::stod(s);
  }
  static void parse(const std::string& s, int& v) { v = std::stoi(s); }
  static void parse(const std::string& s, int64_t& v) { v = std::stoll(s); }
  static void parse(const std::string& s, uint64_t& v) { v = std::stoull(s); }
  static void parse(const std::string& s, bool& v) { v = s == "1"; }
  static void parse(const std::string& s, std::vector<std::string>& v) {
    v.clear();
    std::stringstream items(s);
    for (std::string item; std::getline(items, item, ',');) {
      v.push_back(item);
    }
  }
  std::vector<Column> columns_;
};

}  // namespace torchamp_apps
