#pragma once

// Loading the digits CSV (64 pixel columns 0..16, then the label 0..9), plain
// or gzip-compressed.

#include <ATen/core/Tensor.h>

#include <stdexcept>
#include <string>

namespace torchamp_train {

/// A malformed input file; what() names the file and the line.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Dataset {
  at::Tensor x;  // [N, 64] float32, pixels / 16
  at::Tensor y;  // [N] int64 labels
};

/// Reads `path` (gzip or plain text). Throws DataError naming the line of the
/// first malformed row (wrong column count, a value that is not an integer,
/// a pixel outside 0..16, a label outside 0..9) or an unreadable/empty file.
Dataset load_digits(const std::string& path);

/// A deterministic shuffled split: the first `test_fraction` of a permutation
/// drawn from `seed` is the test set.
std::pair<Dataset, Dataset> split(const Dataset& all, double test_fraction, uint64_t seed);

}  // namespace torchamp_train
