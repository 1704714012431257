#pragma once

// The text a run trains on: a byte-level (character) vocabulary built from
// the corpus itself, nanoGPT's split (the first 90% trains, the rest
// validates), and the batches, drawn by a counter-based hash that the Python
// twin computes alike (gpt_python.py: `offsets`).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchamp_gpt {

struct Corpus {
  std::vector<uint8_t> chars;  // token id -> byte, sorted
  at::Tensor train, val;       // int64 token ids

  /// Reads `path` and builds the vocabulary. Throws std::invalid_argument for
  /// a missing, unreadable or empty file, a split shorter than
  /// `context + 1` tokens, and a `vocab` (> 0) smaller than the corpus's
  /// distinct characters.
  static Corpus load(const std::string& path, int64_t context, int64_t vocab);
  int64_t vocab_size() const { return static_cast<int64_t>(chars.size()); }
  std::string decode(const at::Tensor& ids) const;
  at::Tensor encode(const std::string& text) const;
};

/// The start offsets of `count` windows of `context + 1` tokens in a split of
/// `length` tokens: window g of step `step` in stream `stream` (0: training,
/// 1: validation) starts at splitmix64(key) % (length - context), key mixing
/// the seed, stream, step and g.
std::vector<int64_t> offsets(uint64_t seed, uint64_t stream, int64_t step, int64_t first,
                             int64_t count, int64_t length, int64_t context);

/// Inputs and targets (count, context) of those windows of `split`.
std::pair<at::Tensor, at::Tensor> batch(const at::Tensor& split, const std::vector<int64_t>& starts,
                                        int64_t context);

}  // namespace torchamp_gpt
