#pragma once

// torchamp-train's results: summary.csv's columns, and the table and the
// plots of a run folder's finished modes.

#include "run_folder.h"
#include "run_state.h"
#include "train.h"

#include <ostream>
#include <vector>

namespace torchamp_train {

/// summary.csv: a row per finished mode.
extern const torchamp_apps::Columns<ModeResult> kSummary;

/// The finished modes' rows of summary.csv, and their table (markdown).
std::vector<ModeResult> read_summaries(torchamp_apps::RunLogs& logs);
void print_table(std::ostream& os, const std::vector<ModeResult>& results);

/// The table, then loss.png, scale.png, accuracy.png, underflow.png and
/// underflow-layers.png from metrics.csv (where gnuplot is installed).
void report(torchamp_apps::RunFolder& folder, const Config& config);

}  // namespace torchamp_train
