#include "run_state.h"

#include "launch.h"
#include "support.h"

#include <torchamp/grad_scaler.h>

#include <ATen/core/List.h>
#include <ATen/ops/empty.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace torchamp_apps {

namespace {

void write_int(torch::serialize::OutputArchive& a, const std::string& key, int64_t v) {
  a.write(key, c10::IValue(v));
}

int64_t read_int(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  a.read(key, v);
  return v.toInt();
}

void write_position(torch::serialize::OutputArchive& a, const Position& p) {
  write_int(a, "position/mode_index", p.mode_index);
  write_int(a, "position/step", p.step);
  write_int(a, "position/metrics_bytes", p.metrics_bytes);
  write_int(a, "position/summary_bytes", p.summary_bytes);
  a.write("position/rank_log_bytes", c10::IValue(c10::List<int64_t>(p.rank_log_bytes)));
}

Position read_position(torch::serialize::InputArchive& a) {
  Position p;
  p.mode_index = read_int(a, "position/mode_index");
  p.step = read_int(a, "position/step");
  p.metrics_bytes = read_int(a, "position/metrics_bytes");
  p.summary_bytes = read_int(a, "position/summary_bytes");
  c10::IValue logs;
  if (a.try_read("position/rank_log_bytes", logs)) {  // absent before multi-process runs
    p.rank_log_bytes = logs.toIntVector();
  }
  return p;
}

std::string shard_key(size_t rank) {
  return "optimizer_shard/" + std::to_string(rank);
}

}  // namespace

Position read_position(const std::string& checkpoint_path) {
  torch::serialize::InputArchive a;
  a.load_from(checkpoint_path);
  return read_position(a);
}

void save_position(const std::string& checkpoint_path, const Position& position) {
  torch::serialize::OutputArchive a;
  write_position(a, position);
  save_atomically(a, checkpoint_path);
}

RunState& RunState::counter(std::string key, int64_t& value) {
  counters_.emplace_back("counters/" + std::move(key), &value);
  return *this;
}

RunState& RunState::seconds(std::string key, double& value) {
  seconds_.emplace_back("times/" + std::move(key), &value);
  return *this;
}

RunState& RunState::model(torch::nn::Module& model) {
  model_ = &model;
  return *this;
}

RunState& RunState::optimizer(torch::optim::Optimizer& optimizer) {
  optimizer_ = &optimizer;
  shard_ = -1;
  return *this;
}

RunState& RunState::optimizer_shard(torch::optim::Optimizer& optimizer, int rank) {
  optimizer_ = &optimizer;
  shard_ = rank;
  return *this;
}

RunState& RunState::scaler(torchamp::GradScaler& scaler) {
  scaler_ = &scaler;
  return *this;
}

RunState& RunState::data_parallel(DataParallel& ddp) {
  ddp_ = &ddp;
  return *this;
}

std::string RunState::optimizer_bytes() const {
  torch::serialize::OutputArchive opt;
  optimizer_->save(opt);
  std::ostringstream s;
  opt.save_to(s);
  return s.str();
}

void RunState::save(const std::string& path, const Position& position,
                    const std::vector<std::string>& shards) const {
  torch::serialize::OutputArchive a;
  write_position(a, position);
  for (const auto& [key, value] : counters_) {
    write_int(a, key, *value);
  }
  for (const auto& [key, value] : seconds_) {
    a.write(key, c10::IValue(*value));
  }
  if (model_ != nullptr) {
    torch::serialize::OutputArchive m;
    model_->save(m);
    a.write("model", m);
  }
  if (optimizer_ != nullptr && shard_ >= 0) {
    for (size_t r = 0; r < shards.size(); ++r) {
      at::Tensor bytes = at::empty({static_cast<int64_t>(shards[r].size())}, at::kByte);
      std::memcpy(bytes.data_ptr(), shards[r].data(), shards[r].size());
      a.write(shard_key(r), bytes);
    }
  } else if (optimizer_ != nullptr) {
    torch::serialize::OutputArchive o;
    optimizer_->save(o);
    a.write("optimizer", o);
  }
  if (scaler_ != nullptr) {
    torch::serialize::OutputArchive s;
    s << *scaler_;
    a.write("scaler", s);
  }
  // The buckets as their sizes and their indices, one after the other.
  const auto buckets = ddp_ != nullptr ? ddp_->buckets() : std::vector<std::vector<int64_t>>{};
  if (!buckets.empty()) {
    c10::List<int64_t> sizes, indices;
    for (const auto& b : buckets) {
      sizes.push_back(static_cast<int64_t>(b.size()));
      for (const int64_t i : b) {
        indices.push_back(i);
      }
    }
    a.write("data_parallel/bucket_sizes", c10::IValue(sizes));
    a.write("data_parallel/bucket_indices", c10::IValue(indices));
  }
  save_atomically(a, path);
}

int64_t RunState::resume(const std::string& path, int64_t mode_index) const {
  if (path.empty()) {
    return 0;
  }
  const Position saved = read_position(path);
  if (saved.mode_index != mode_index || saved.step <= 0) {
    return 0;
  }
  load(path);
  return saved.step;
}

Position RunState::load(const std::string& path) const {
  torch::serialize::InputArchive a;
  a.load_from(path);
  const Position p = read_position(a);
  for (const auto& [key, value] : counters_) {
    *value = read_int(a, key);
  }
  for (const auto& [key, value] : seconds_) {
    c10::IValue v;
    a.read(key, v);
    *value = v.toDouble();
  }
  if (model_ != nullptr) {
    torch::serialize::InputArchive m;
    a.read("model", m);
    model_->load(m);
  }
  if (optimizer_ != nullptr) {
    torch::serialize::InputArchive o;
    if (shard_ >= 0) {
      at::Tensor bytes;
      a.read(shard_key(static_cast<size_t>(shard_)), bytes);
      o.load_from(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
    } else {
      a.read("optimizer", o);
    }
    optimizer_->load(o);
  }
  if (scaler_ != nullptr) {
    torch::serialize::InputArchive s;
    a.read("scaler", s);
    s >> *scaler_;
  }
  c10::IValue sizes, indices;  // absent: saved on one process
  if (ddp_ != nullptr && a.try_read("data_parallel/bucket_sizes", sizes) &&
      a.try_read("data_parallel/bucket_indices", indices)) {
    const auto flat = indices.toIntVector();
    std::vector<std::vector<int64_t>> buckets;
    size_t at = 0;
    for (const int64_t n : sizes.toIntVector()) {
      if (n < 0 || at + static_cast<size_t>(n) > flat.size()) {
        throw std::runtime_error(path + ": its DDP buckets do not add up");
      }
      buckets.emplace_back(flat.begin() + static_cast<std::ptrdiff_t>(at),
                           flat.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(n)));
      at += static_cast<size_t>(n);
    }
    ddp_->set_buckets(buckets);
  }
  return p;
}

void RunLogs::start(const std::string& metrics_header, const std::string& summary_header) {
  fs::create_directories(dir_);
  std::ofstream(path(run_files::kMetrics)) << metrics_header << "\n";
  std::ofstream(path(run_files::kSummary)) << summary_header << "\n";
  open();
}

void RunLogs::resume(const Position& p) {
  if (p.metrics_bytes > 0) {
    fs::resize_file(path(run_files::kMetrics), static_cast<uintmax_t>(p.metrics_bytes));
    fs::resize_file(path(run_files::kSummary), static_cast<uintmax_t>(p.summary_bytes));
  }
  open();
}

void RunLogs::bookmark(Position& p) {
  metrics_.flush();
  summary_.flush();
  if (!metrics_ || !summary_) {
    throw std::runtime_error("cannot write the logs in " + dir_.string());
  }
  p.metrics_bytes = static_cast<int64_t>(fs::file_size(path(run_files::kMetrics)));
  p.summary_bytes = static_cast<int64_t>(fs::file_size(path(run_files::kSummary)));
}

std::vector<std::vector<std::string>> RunLogs::metrics_rows() {
  metrics_.flush();
  return read_csv(path(run_files::kMetrics));
}

std::vector<std::vector<std::string>> RunLogs::summary_rows() {
  summary_.flush();
  return read_csv(path(run_files::kSummary));
}

void RunLogs::open() {
  metrics_.open(path(run_files::kMetrics), std::ios::app);
  metrics_ << std::setprecision(9);
  summary_.open(path(run_files::kSummary), std::ios::app);
  if (!metrics_ || !summary_) {
    throw std::runtime_error("cannot open the logs in " + dir_.string());
  }
}

std::string g17(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string cell(double v) {
  return std::isnan(v) ? "" : g17(v);
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream s(line);
  for (std::string f; std::getline(s, f, ',');) {
    fields.push_back(f);
  }
  if (!line.empty() && line.back() == ',') {
    fields.emplace_back();
  }
  return fields;
}

std::vector<std::vector<std::string>> read_csv(const fs::path& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    rows.push_back(split_csv(line));
  }
  return rows;
}

std::string timestamped(const std::string& prefix) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d_%H-%M-%S", &tm);
  return prefix + stamp;
}

}  // namespace torchamp_apps
