#pragma once

// A main job's run folder, the same in every app under apps/: one rule for
// --out, one set of file names, the options file and its comparison, the
// position a run continues from, the finished marker, and each rank's own
// log. Each app (its main.cpp, command_line.cpp and results.cpp) decides
// only what goes into the files.

#include "run_state.h"
#include "support.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

namespace torchamp_apps {

/// The options of the run around the numbers, the same in every app
/// (cli.h reads them from the command line).
struct RunArgs {
  std::string out;               // --out: the run folder; empty: default_prefix + date-time
  std::string default_prefix;    // the app's, e.g. "runs/gpt-"
  int64_t checkpoint_every = 0;  // --checkpoint-every: steps; 0: none
  double timeout_s = 300;        // --timeout: seconds a collective may wait
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  }
};

class RankLog;

/// A run folder as a rank finds it: new, or holding a run to continue (or
/// one already finished). Every rank opens it; rank 0 alone writes the
/// options, the logs, the checkpoints and the marker.
class RunFolder {
 public:
  /// --out DIR, the rule of every app: a missing or empty folder starts a
  /// run; one holding a run of the same `options` continues it from its
  /// checkpoint (the same command again, or torchrun restarting it); one
  /// holding a run of other options, or anything else, is refused, naming
  /// the first option that differs. `app` names the program in messages.
  /// Throws std::invalid_argument; writes nothing.
  static RunFolder open(const std::filesystem::path& dir, const Options& options,
                        const std::string& app);
  /// open() on --out as `args` give it, or, without one, a new folder named
  /// from this process's clock (args.default_prefix and the date and time).
  /// On more than one process (`world`) --out is required: every rank must
  /// open the same folder, and their clocks need not agree on the second.
  static RunFolder open(const RunArgs& args, int world, const Options& options,
                        const std::string& app);
  /// --resume DIR: a run folder whose own options the run adopts
  /// (saved_options()). Throws std::invalid_argument when DIR holds no run.
  static RunFolder existing(const std::filesystem::path& dir, const std::string& app);

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path path(const std::string& name) const { return dir_ / name; }
  std::string checkpoint() const { return path(run_files::kCheckpoint).string(); }
  /// The options the folder's run started with (empty for a new folder).
  const Options& saved_options() const { return saved_; }
  /// Whether the folder holds a run (its options file).
  bool holds_run() const { return !saved_.empty(); }
  /// Where the run stands: its checkpoint's position ({} without one).
  const Position& position() const { return position_; }
  /// Whether the run stopped inside a mode (its checkpoint holds the model).
  bool mid_mode() const { return position_.step > 0; }
  /// Whether a rank continues the run's logs (cut back to the checkpoint)
  /// rather than starting them.
  bool continuing() const { return position_.metrics_bytes > 0; }
  /// Whether all of the run's `modes` are done (the marker, or a position
  /// past the last: a run from before the marker).
  bool finished(std::size_t modes) const;
  /// finished(modes), and if so rank 0 says so ("<app>: the run in DIR has
  /// finished ...; nothing to do") and prints `results`.
  bool report_if_finished(std::size_t modes, int rank, const std::string& app,
                          const std::function<void()>& results) const;
  /// "resuming at mode M/N, step S from <checkpoint>" for a run that
  /// continues; for one that starts, that it starts again (the folder held
  /// a run of its options but no checkpoint) or nothing (a new folder).
  std::string resume_line(std::size_t modes) const;

  /// The hooks' run-folder half: a checkpoint every `args.checkpoint_every`
  /// steps into checkpoint(), and a bookmark that flushes rank 0's logs and
  /// records their sizes (an app adds its step, and what else it records).
  /// The bookmark refers to this folder: call it on the folder the run keeps,
  /// not on one that is then copied or moved.
  template <class Row>
  Hooks<Row> hooks(const RunArgs& args, bool root) {
    Hooks<Row> h;
    h.checkpoint_every = args.checkpoint_every;
    h.checkpoint_path = checkpoint();
    h.bookmark = [this, root](Position& p) {
      if (root) {
        logs_.bookmark(p);
      }
    };
    return h;
  }

  /// Trains the run's `modes` from position() on, on every rank:
  /// `train(i, from)` runs mode i (`from`: the checkpoint to continue it
  /// from, or empty), rank 0 `record`s its result (summary.csv's row), and a
  /// position past it goes through `bookmark` (flushing the logs; a
  /// collective where the app's is) into the checkpoint, so that a resumed
  /// run never repeats a finished mode. Rank 0 marks the run finished.
  template <class Result>
  void run_modes(std::size_t modes, bool root,
                 const std::function<Result(int64_t, const std::string&)>& train,
                 const std::function<void(const Result&)>& record,
                 const std::function<void(Position&)>& bookmark) {
    const int64_t first = position_.mode_index;
    const std::string from = mid_mode() ? checkpoint() : "";
    for (int64_t i = first; i < static_cast<int64_t>(modes); ++i) {
      const Result result = train(i, i == first ? from : "");
      if (root) {
        record(result);
      }
      Position next{i + 1, 0, 0, 0, {}};
      bookmark(next);
      if (root) {
        save_position(checkpoint(), next);
      }
    }
    if (root) {
      mark_finished();
    }
  }

  /// Rank 0, a run from the start: the options file and the logs' headers;
  /// an older run's checkpoint, rank logs and marker go.
  void start(const Options& options, const std::string& metrics_header,
             const std::string& summary_header);
  /// Rank 0, continuing at position(): what was written after the
  /// checkpoint goes (the options file is rewritten under today's name).
  void resume();
  /// Rank 0: resume() a run that continues, else start() one.
  void start_or_resume(const Options& options, const std::string& metrics_header,
                       const std::string& summary_header) {
    continuing() ? resume() : start(options, metrics_header, summary_header);
  }
  RunLogs& logs() { return logs_; }
  /// Rank 0: every mode is done.
  void mark_finished();
  /// Rank `rank`'s own log's path, ranks/rank<r>.csv.
  std::filesystem::path rank_log(int rank) const;
  /// Rank `rank`'s own log with `header`, cut back to position() where the
  /// run continues, else new.
  RankLog open_rank_log(int rank, const std::string& header) const;

 private:
  RunFolder(std::filesystem::path dir, Options saved);
  std::filesystem::path dir_;
  Options saved_;
  bool found_run_;  // the folder held a run when opened (start() makes it hold one)
  Position position_;
  RunLogs logs_;
};

/// The options file in `dir` (today's name, else the old one); empty when
/// there is none.
Options read_run_options(const std::filesystem::path& dir);

/// Each rank's own record of its steps, ranks/rank<r>.csv, one `header`
/// and a row per step, appended as the run goes. A checkpoint records its
/// size (Position::rank_log_bytes); a resume cuts it back to that.
class RankLog {
 public:
  RankLog(std::filesystem::path path, std::string header)
      : path_(std::move(path)), header_(std::move(header)) {}

  /// A new log holding only its header.
  void start();
  /// Back to its size at `p` (what this rank wrote after it goes); a new
  /// log where `p` has no size for this rank.
  void resume(const Position& p, int rank);
  /// Appends to the log, a new one (its header) where there is none.
  void append();
  std::ofstream& out() { return log_; }
  /// Flushes and returns the log's size.
  int64_t flush();

 private:
  void open();
  std::filesystem::path path_;
  std::string header_;
  std::ofstream log_;
};

}  // namespace torchamp_apps
