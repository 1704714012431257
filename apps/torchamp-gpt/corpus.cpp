#include "corpus.h"

#include <ATen/ATen.h>

#include <array>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace torchamp_gpt {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

Corpus Corpus::load(const std::string& path, int64_t context, int64_t vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::invalid_argument("cannot read the corpus " + path);
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.empty()) {
    throw std::invalid_argument("the corpus " + path + " is empty");
  }
  std::array<bool, 256> seen{};
  for (const char c : text) {
    seen[static_cast<uint8_t>(c)] = true;
  }
  Corpus corpus;
  std::array<int64_t, 256> id{};
  for (int b = 0; b < 256; ++b) {
    if (seen[b]) {
      id[b] = static_cast<int64_t>(corpus.chars.size());
      corpus.chars.push_back(static_cast<uint8_t>(b));
    }
  }
  if (vocab > 0 && vocab < corpus.vocab_size()) {
    throw std::invalid_argument("--vocab " + std::to_string(vocab) + " does not fit the corpus " +
                                path + ": it has " + std::to_string(corpus.vocab_size()) +
                                " distinct characters");
  }
  const auto n = static_cast<int64_t>(text.size());
  const int64_t n_train = n * 9 / 10;
  if (n_train < context + 1 || n - n_train < context + 1) {
    throw std::invalid_argument("--context " + std::to_string(context) +
                                " is longer than the data: " + path + " has " + std::to_string(n) +
                                " characters, its split " + std::to_string(n_train) + " + " +
                                std::to_string(n - n_train) + " (each needs context + 1)");
  }
  auto ids = at::empty({n}, at::kLong);
  auto* p = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    p[i] = id[static_cast<uint8_t>(text[static_cast<size_t>(i)])];
  }
  corpus.train = ids.slice(0, 0, n_train).clone();
  corpus.val = ids.slice(0, n_train, n).clone();
  return corpus;
}

std::string Corpus::decode(const at::Tensor& ids) const {
  const auto flat = ids.to(at::kLong).contiguous().view({-1});
  std::string s;
  for (int64_t i = 0; i < flat.numel(); ++i) {
    s += static_cast<char>(chars.at(static_cast<size_t>(flat[i].item<int64_t>())));
  }
  return s;
}

at::Tensor Corpus::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const char c : text) {
    for (size_t i = 0; i < chars.size(); ++i) {
      if (chars[i] == static_cast<uint8_t>(c)) {
        ids.push_back(static_cast<int64_t>(i));
      }
    }
  }
  return at::tensor(ids, at::kLong).view({1, -1});
}

std::vector<int64_t> offsets(uint64_t seed, uint64_t stream, int64_t step, int64_t first,
                             int64_t count, int64_t length, int64_t context) {
  std::vector<int64_t> out;
  const uint64_t base = splitmix64(splitmix64(seed) ^ (stream << 62) ^ static_cast<uint64_t>(step));
  for (int64_t g = first; g < first + count; ++g) {
    const uint64_t h = splitmix64(base ^ static_cast<uint64_t>(g));
    out.push_back(static_cast<int64_t>(h % static_cast<uint64_t>(length - context)));
  }
  return out;
}

std::pair<at::Tensor, at::Tensor> batch(const at::Tensor& split, const std::vector<int64_t>& starts,
                                        int64_t context) {
  std::vector<at::Tensor> xs, ys;
  for (const int64_t s : starts) {
    xs.push_back(split.slice(0, s, s + context));
    ys.push_back(split.slice(0, s + 1, s + context + 1));
  }
  return {at::stack(xs), at::stack(ys)};
}

}  // namespace torchamp_gpt
