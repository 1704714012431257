#pragma once

// App support: what every main job under apps/ needs beyond the library
// (memory and time measurement, MKL's reproducibility, atomic checkpoints and
// their test hooks, the run folder's options file, gnuplot). It lives here
// once; the library knows nothing of it.

#include <torch/optim/optimizer.h>
#include <torch/serialize/output-archive.h>

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace torchamp_apps {

/// Resets / reads the process's peak resident memory, and reads its current
/// resident memory (Linux; 0 elsewhere).
void reset_peak_rss();
double peak_rss_mb();
double rss_mb();

/// Bytes per parameter element of `params` with their gradients and
/// `optimizer`'s state, summed over the tensors that exist (moments, momentum
/// buffers, torchamp's master weights); a trainable parameter's gradient
/// counts at the parameter's size and dtype also when zero_grad() freed it.
double bytes_per_param(const torch::optim::Optimizer& optimizer,
                       const std::vector<at::Tensor>& params);

/// Sets every parameter group's learning rate (Adam, AdamW and SGD options,
/// LibTorch's optimizers and torchamp's alike).
void set_lr(torch::optim::Optimizer& optimizer, double lr);

/// Seconds from `t` to now.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// A module's parameters by name (detached), as a dict torch::pickle_save
/// writes and Python's torch.load reads.
c10::Dict<std::string, at::Tensor> parameters_dict(const torch::nn::Module& module);

/// torch::pickle_save(value) into `path` (a Python twin's input); throws
/// std::runtime_error where it cannot be written.
void write_pickle(const std::string& path, const c10::IValue& value);

/// Makes the run reproducible run to run where the LibTorch's BLAS is MKL
/// (the pip wheels, pytorch.org's archive; MKL as Debian's libblas): MKL's
/// calls from this thread run on one thread. ATen's own kernels keep their
/// threads (their split depends only on the thread count). Returns what it
/// did, for the log; false when there is no MKL.
bool pin_mkl_to_one_thread();

/// A banner's line on what makes the numbers repeat: `deterministic` (the
/// run's option) and `pinned` (what pin_mkl_to_one_thread did).
std::string determinism_line(bool deterministic, bool pinned);

/// Saves `archive` to `path` through a temporary name: a process killed while
/// writing leaves the last complete checkpoint in place. Test hook
/// TORCHAMP_TRAIN_KILL_IN_CHECKPOINT=K: SIGKILL right after writing the
/// temporary file of this process's K-th checkpoint.
void save_atomically(torch::serialize::OutputArchive& archive, const std::string& path);

/// Test hook TORCHAMP_TRAIN_KILL_AT_STEP=K: SIGKILL after this process's K-th
/// call. With TORCHAMP_TRAIN_KILL_ONCE=FILE the hooks fire only while FILE
/// does not exist, and create it: once per job, not again in the processes
/// torchrun restarts with the same environment.
void maybe_die_after_step();

/// A run folder's options file: one `key=value` a line.
using Options = std::map<std::string, std::string>;
void write_options(const std::string& path, const Options& options);
Options read_options(const std::string& path);
/// The first key (in key order) whose value differs between two options
/// files, a key one of them lacks reading as `missing`; none when they agree.
/// The one comparison behind every app's `--out` rule.
struct OptionDifference {
  std::string key, a, b;
};
std::optional<OptionDifference> differing_option(const Options& a, const Options& b,
                                                 const std::string& missing);

/// The entry of `all` whose `name` is `name`; throws std::invalid_argument
/// "unknown <what> '<name>'" otherwise.
template <class T>
const T& find_named(const std::vector<T>& all, const std::string& name, const char* what) {
  for (const auto& entry : all) {
    if (entry.name == name) {
      return entry;
    }
  }
  throw std::invalid_argument(std::string("unknown ") + what + " '" + name + "'");
}

/// The names of the entries of `all` for which `keep(entry)` holds, in order.
template <class T, class Keep>
std::vector<std::string> names_where(const std::vector<T>& all, Keep keep) {
  std::vector<std::string> names;
  for (const auto& entry : all) {
    if (keep(entry)) {
      names.push_back(entry.name);
    }
  }
  return names;
}

/// The names of all the entries of `all`, in order.
template <class T>
std::vector<std::string> names_of(const std::vector<T>& all) {
  return names_where(all, [](const T&) { return true; });
}

/// This CPU's native matrix instructions for bfloat16 and float16, for a
/// banner: "AMX-BF16, AVX-512 BF16: bfloat16 matmuls native, float16 not"
/// or "AVX2 only: neither bfloat16 nor float16 matmuls native" (the flags of
/// Linux's /proc/cpuinfo; torchamp::cpu_has_fast decides "native").
std::string cpu_half_precision_support();

/// Before a CPU mode whose matmuls run in one of `dtypes`: a line saying it
/// will take far longer than float32 where this CPU has no native bfloat16 /
/// float16 matmuls (torchamp::cpu_has_fast); empty otherwise.
std::string slow_here(const std::string& mode, std::initializer_list<at::ScalarType> dtypes);

/// The file an app reads without --data: the one installed beside the
/// program (<prefix>/share/torchamp/<name>, for <prefix>/bin/<program>),
/// else `built` (the source or build tree's copy, its path compiled in).
std::string default_data(const std::string& name, const std::string& built);

/// That copy's path, for `built`: each app defines it in its built_data.cpp,
/// the one file whose compile line names the checkout or the build folder.
/// ccache's base_dir does not rewrite a path inside a -D value, so any other
/// file holding it (command_line.cpp, which calls it) would miss the cache in
/// every clone in another folder.
const char* built_data_path();

/// An app's main after its command line: runs `body` and turns what it
/// throws into the exit code, with "<app>: error: <what>" on stderr:
/// std::invalid_argument (a bad option, launch environment, run folder or
/// data file: nothing was written) 2, anything else 1.
int run_app(const char* app, const std::function<int()>& body);

/// An app's whole main: `parse` fills `Args` from the command line and
/// returns -1 to go on (else the exit code: --help, a bad option), then
/// run_app runs `body` on them.
template <class Args>
int app_main(const char* app, int argc, char** argv, int (*parse)(int, char**, Args&),
             const std::function<int(Args&)>& body) {
  Args args;
  if (const int rc = parse(argc, argv, args); rc >= 0) {
    return rc;
  }
  return run_app(app, [&] { return body(args); });
}

/// Whether gnuplot is on PATH, and running a script with it (true on success).
bool have_gnuplot();
bool run_gnuplot(const std::string& script_path);

}  // namespace torchamp_apps
