#include "data.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/randperm.h>
#include <zlib.h>

#include <memory>
#include <sstream>
#include <vector>

namespace torchamp_train {
namespace {

constexpr int kPixels = 64;

// gzopen reads gzip files and, transparently, plain ones.
struct GzFile {
  gzFile f;
  explicit GzFile(const std::string& path) : f(gzopen(path.c_str(), "rb")) {}
  ~GzFile() {
    if (f != nullptr) {
      gzclose(f);
    }
  }
};

bool read_line(gzFile f, std::string& line) {
  line.clear();
  char buf[4096];
  while (gzgets(f, buf, sizeof buf) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      break;
    }
  }
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) {
    line.pop_back();
  }
  return !line.empty() || !gzeof(f);
}

[[noreturn]] void fail(const std::string& path, int64_t line_no, const std::string& what) {
  std::ostringstream msg;
  msg << path << ":" << line_no << ": " << what;
  throw DataError(msg.str());
}

}  // namespace

Dataset load_digits(const std::string& path) {
  GzFile file(path);
  if (file.f == nullptr) {
    throw DataError(path + ": cannot open the file");
  }
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  std::string line;
  int64_t line_no = 0;
  while (read_line(file.f, line)) {
    ++line_no;
    if (line.empty()) {
      continue;  // a trailing empty line
    }
    std::vector<long> values;
    size_t pos = 0;
    while (pos <= line.size()) {
      const size_t comma = std::min(line.find(',', pos), line.size());
      const std::string field = line.substr(pos, comma - pos);
      size_t used = 0;
      long v = 0;
      try {
        v = std::stol(field, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != field.size()) {
        fail(path, line_no,
             "column " + std::to_string(values.size() + 1) + ": '" + field + "' is not an integer");
      }
      values.push_back(v);
      pos = comma + 1;
    }
    if (values.size() != kPixels + 1) {
      fail(path, line_no,
           "expected 65 comma-separated values (64 pixels, then the label), got " +
               std::to_string(values.size()));
    }
    for (int i = 0; i < kPixels; ++i) {
      if (values[i] < 0 || values[i] > 16) {
        fail(path, line_no,
             "pixel " + std::to_string(i + 1) + " is " + std::to_string(values[i]) +
                 ", outside 0..16");
      }
      pixels.push_back(static_cast<float>(values[i]) / 16.0f);
    }
    if (values[kPixels] < 0 || values[kPixels] > 9) {
      fail(path, line_no, "label " + std::to_string(values[kPixels]) + " is outside 0..9");
    }
    labels.push_back(values[kPixels]);
  }
  if (labels.empty()) {
    throw DataError(path + ": no data rows");
  }
  const auto n = static_cast<int64_t>(labels.size());
  Dataset d;
  d.x = at::from_blob(pixels.data(), {n, kPixels}, at::kFloat).clone();
  d.y = at::from_blob(labels.data(), {n}, at::kLong).clone();
  return d;
}

std::pair<Dataset, Dataset> split(const Dataset& all, double test_fraction, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t n = all.x.size(0);
  const at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
  const auto n_test = static_cast<int64_t>(static_cast<double>(n) * test_fraction);
  const at::Tensor test_idx = perm.slice(0, 0, n_test);
  const at::Tensor train_idx = perm.slice(0, n_test, n);
  return {{all.x.index_select(0, train_idx), all.y.index_select(0, train_idx)},
          {all.x.index_select(0, test_idx), all.y.index_select(0, test_idx)}};
}

}  // namespace torchamp_train
