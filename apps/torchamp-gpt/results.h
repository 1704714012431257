#pragma once

// torchamp-gpt's results: summary.csv's columns (the Python twin's too), and
// the table and the plot of a run folder, with Python's run where it has one.

#include "run_state.h"
#include "train.h"

#include <filesystem>

namespace torchamp_gpt {

/// summary.csv (and the Python twin's python-summary.csv): a row per mode.
extern const torchamp_apps::Columns<ModeResult> kSummary;

/// The table (C++ and, where python-summary.csv is there, Python's) and
/// loss.png of the run folder `out`.
void report(const std::filesystem::path& out);

}  // namespace torchamp_gpt
