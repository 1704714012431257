#pragma once

// What the benchmarks share: their command line and the collection of the
// medians that their summary tables are computed from.

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace torchamp_bench {

/// Takes --threads=N (else OMP_NUM_THREADS, else every hardware thread: ATen's
/// own default can be fewer, it counts physical cores) and every option
/// starting with one of `own` (handed to `take` and removed), adds
/// `default_min_time` unless a --benchmark_min_time is given, and initialises
/// Google Benchmark with the rest. Returns the thread count (>= 1).
template <class Take>
int init(int argc, char** argv, const char* default_min_time, const std::vector<std::string>& own,
         Take take) {
  std::vector<char*> args = {argv[0]};
  std::string min_time = std::string("--benchmark_min_time=") + default_min_time;
  bool has_min_time = false;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    threads = std::atoi(omp);
  }
  for (int a = 1; a < argc; ++a) {
    if (std::strncmp(argv[a], "--threads=", 10) == 0) {
      threads = std::atoi(argv[a] + 10);
      continue;
    }
    const bool mine = std::any_of(own.begin(), own.end(), [&](const std::string& prefix) {
      return std::strncmp(argv[a], prefix.c_str(), prefix.size()) == 0;
    });
    if (mine) {
      take(std::string(argv[a]));
      continue;
    }
    has_min_time = has_min_time || std::strncmp(argv[a], "--benchmark_min_time", 20) == 0;
    args.push_back(argv[a]);
  }
  if (!has_min_time) {
    args.push_back(min_time.data());
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  return std::max(threads, 1);
}

/// Prints Google Benchmark's table and keeps, per benchmark name, the median
/// of the repetitions (or the single run): its real time in seconds and, when
/// it set bytes processed, its GB/s.
class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (!median && run.run_type != Run::RT_Iteration) {
        continue;
      }
      const std::string name = run.run_name.function_name;
      if (median || !has_median_.count(name)) {
        seconds[name] = run.GetAdjustedRealTime() / unit_per_second(run.time_unit);
        auto it = run.counters.find("bytes_per_second");
        if (it != run.counters.end()) {
          gbps[name] = it->second.value / 1e9;
        }
      }
      if (median) {
        has_median_.insert(name);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> seconds;
  std::map<std::string, double> gbps;

 private:
  static double unit_per_second(benchmark::TimeUnit unit) {
    switch (unit) {
      case benchmark::kSecond:
        return 1;
      case benchmark::kMillisecond:
        return 1e3;
      case benchmark::kMicrosecond:
        return 1e6;
      default:
        return 1e9;
    }
  }
  std::set<std::string> has_median_;
};

}  // namespace torchamp_bench
