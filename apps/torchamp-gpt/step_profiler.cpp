#include "step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <set>
#include <stdexcept>
#include <utility>

namespace torchamp_gpt {

namespace {

namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

// A KinetoEvent's start and duration in microseconds: LibTorch 2.x gives
// nanoseconds (startNs, durationNs), 1.13 microseconds (startUs,
// durationUs); the overload that compiles is taken (call with 0).
template <typename E>
auto span_us(const E& e, int) -> decltype(e.startNs(), std::pair<double, double>()) {
  return {static_cast<double>(e.startNs()) / 1e3, static_cast<double>(e.durationNs()) / 1e3};
}
template <typename E>
std::pair<double, double> span_us(const E& e, long) {
  return {static_cast<double>(e.startUs()), static_cast<double>(e.durationUs())};
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(ch));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// The trace where this LibTorch was built without Kineto (Debian's): the
// host's operators and the "step" marks, in Kineto's Chrome-trace fields,
// from the events the profiler collected without it.
void write_host_trace(const prof::ProfilerResult& result, const std::string& path) {
  std::ofstream out(path);
  out << std::fixed << std::setprecision(3) << "{\"traceEvents\": [";
  const char* sep = "\n";
  for (const auto& e : result.events()) {
    const bool user = e.scope() == static_cast<uint8_t>(at::RecordScope::USER_SCOPE);
    const auto [start, duration] = span_us(e, 0);
    out << sep << "{\"ph\": \"X\", \"cat\": \""
        << (e.deviceType() != c10::DeviceType::CPU ? "kernel"
            : user                                 ? "user_annotation"
                                                   : "cpu_op")
        << "\", \"name\": " << json_string(e.name())
        << ", \"pid\": 0, \"tid\": " << e.startThreadId() << ", \"ts\": " << start
        << ", \"dur\": " << duration << "}";
    sep = ",\n";
  }
  out << "\n]}\n";
  out.close();
  if (!out) {
    throw std::runtime_error("--profile: could not write " + path);
  }
}

}  // namespace

StepProfiler::StepProfiler(bool cuda) {
  if (prof::profilerEnabled()) {
    throw std::logic_error("--profile: LibTorch's profiler is already on in this process");
  }
  // As torch.profiler.profile starts it: prepared (Kineto's set-up, kept out
  // of the trace), then enabled for every scope (the "step" marks are user
  // scopes).
  const ProfilerConfig config(ProfilerState::KINETO);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) {
    activities.insert(ActivityType::CUDA);
  }
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  on_ = true;
}

StepProfiler::~StepProfiler() {
  if (on_) {
    try {
      prof::disableProfiler();
    } catch (...) {  // a destructor on an error's path: the error that got here counts
    }
  }
}

void StepProfiler::save(const std::string& path) {
  on_ = false;
  const auto result = prof::disableProfiler();
  try {
    result->save(path);            // Kineto's own trace
  } catch (const c10::Error& e) {  // "requires ... Kineto support": this LibTorch has none
    std::cerr << "torchamp-gpt: LibTorch did not save its trace (" << e.what_without_backtrace()
              << "); " << path << " holds the host's operators, from the profiler's events\n";
    write_host_trace(*result, path);
  }
}

}  // namespace torchamp_gpt
