#include "support.h"

#include <torchamp/autocast.h>
#include <torchamp/optim.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <dlfcn.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>

namespace torchamp_apps {

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    auto& options = group.options();
    if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
      adam->lr(lr);
    } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
      adamw->lr(lr);
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
      sgd->lr(lr);
    }
  }
}

std::string determinism_line(bool deterministic, bool pinned) {
  return !deterministic ? "nondeterministic: MKL (where the LibTorch has it) on its default "
                          "threads; float32 matmuls may differ from run to run"
         : pinned       ? "deterministic: MKL's float32 matmuls on one thread, so the same command "
                          "writes the same numbers every run (--nondeterministic: MKL's threads)"
                        : "deterministic: this LibTorch has no MKL; its BLAS and kernels give the "
                          "same numbers every run";
}

c10::Dict<std::string, at::Tensor> parameters_dict(const torch::nn::Module& module) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& p : module.named_parameters()) {
    dict.insert(p.key(), p.value().detach());
  }
  return dict;
}

void write_pickle(const std::string& path, const c10::IValue& value) {
  const std::vector<char> bytes = torch::pickle_save(value);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    throw std::runtime_error("cannot write " + path);
  }
}

namespace {

void die_by_test_hook() {
  if (const char* once = std::getenv("TORCHAMP_TRAIN_KILL_ONCE"); once != nullptr && *once) {
    if (std::filesystem::exists(once)) {
      return;
    }
    std::ofstream(once) << "killed\n";
  }
  std::raise(SIGKILL);
}

}  // namespace

// The peak resident memory since the last reset: Linux's VmHWM, which
// writing 5 to /proc/self/clear_refs resets (Linux 4.0+); 0 where unknown.
// glibc keeps what a finished mode freed (its heap grows past the mmap
// threshold): handed back first, so that the next mode's peak is its own.
void reset_peak_rss() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
  std::ofstream("/proc/self/clear_refs") << "5";
}

namespace {
double status_mb(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::stod(line.substr(field.size())) / 1024.0;  // kB
    }
  }
  return 0.0;
}
}  // namespace

double peak_rss_mb() {
  return status_mb("VmHWM:");
}

double rss_mb() {
  return status_mb("VmRSS:");
}

double bytes_per_param(const torch::optim::Optimizer& optimizer,
                       const std::vector<at::Tensor>& params) {
  double bytes = 0, elements = 0;
  auto add = [&bytes](const at::Tensor& t) {
    bytes += t.defined() ? static_cast<double>(t.nbytes()) : 0.0;
  };
  for (const auto& p : params) {
    elements += static_cast<double>(p.numel());
    add(p);
    // The gradient a step holds, also when zero_grad() has freed it since
    // (LibTorch 2.x sets it to None): the parameter's size and dtype.
    if (p.grad().defined()) {
      add(p.grad());
    } else if (p.requires_grad()) {
      bytes += static_cast<double>(p.nbytes());
    }
  }
  for (const auto& kv : optimizer.state()) {
    const auto* state = kv.second.get();
    if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      add(s->exp_avg());
      add(s->exp_avg_sq());
      add(s->max_exp_avg_sq());
    } else if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      add(a->exp_avg());
      add(a->exp_avg_sq());
      add(a->max_exp_avg_sq());
    } else if (const auto* m = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      add(m->momentum_buffer());
    }
  }
  for (const auto& p : params) {
    if (const auto* o = dynamic_cast<const torchamp::optim::AdamW*>(&optimizer)) {
      add(o->master_weight_storage(p));
    } else if (const auto* a = dynamic_cast<const torchamp::optim::Adam*>(&optimizer)) {
      add(a->master_weight_storage(p));
    } else if (const auto* g = dynamic_cast<const torchamp::optim::SGD*>(&optimizer)) {
      add(g->master_weight_storage(p));
    }
  }
  return elements > 0 ? bytes / elements : 0.0;
}

bool pin_mkl_to_one_thread() {
  // MKL's SGEMM, which runs ATen's float32 matmuls in MKL builds, splits a
  // product across threads in a way that is not bit-reproducible from run to
  // run (MKL's own reproducibility conditions: a fixed thread count, dynamic
  // threading off, a CNR branch; ATen leaves dynamic threading on and CNR
  // off). One MKL thread is. MKL's service functions are exported by the
  // wheels' libtorch_cpu (ATen calls mkl_set_num_threads_local itself) and by
  // libmkl_rt; a LibTorch without MKL has neither, and its BLAS (OpenBLAS,
  // the reference BLAS) splits the output matrix, whose bits do not depend
  // on the split. The C function's symbol is MKL_Set_Num_Threads_Local
  // (mkl_service.h maps the lower-case name to it by a macro); the exported
  // lower-case symbols are the Fortran interface, which takes a pointer.
  using SetThreads = int (*)(int);
  void* symbol = dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local");
  if (symbol == nullptr) {  // libtorch_cpu loaded without RTLD_GLOBAL (in Python)
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &info) != 0 &&
        info.dli_fname != nullptr) {
      if (void* lib = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD)) {
        symbol = dlsym(lib, "MKL_Set_Num_Threads_Local");
        dlclose(lib);
      }
    }
  }
  if (symbol == nullptr) {
    return false;
  }
  reinterpret_cast<SetThreads>(symbol)(1);
  return true;
}

void save_atomically(torch::serialize::OutputArchive& archive, const std::string& path) {
  static int saved = 0;
  const std::string tmp = path + ".tmp";
  archive.save_to(tmp);
  ++saved;
  if (const char* k = std::getenv("TORCHAMP_TRAIN_KILL_IN_CHECKPOINT")) {
    if (std::atoi(k) == saved) {
      die_by_test_hook();
    }
  }
  std::filesystem::rename(tmp, path);
}

void maybe_die_after_step() {
  static int64_t steps = 0;
  static const char* k = std::getenv("TORCHAMP_TRAIN_KILL_AT_STEP");
  if (k != nullptr && ++steps == std::atoll(k)) {
    die_by_test_hook();
  }
}

void write_options(const std::string& path, const Options& options) {
  std::ofstream out(path);
  for (const auto& [k, v] : options) {
    out << k << "=" << v << "\n";
  }
  if (!out) {
    throw std::runtime_error("cannot write " + path);
  }
}

Options read_options(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error("cannot read " + path);
  }
  Options kv;
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) {
      kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  return kv;
}

std::optional<OptionDifference> differing_option(const Options& a, const Options& b,
                                                 const std::string& missing) {
  auto value = [&missing](const Options& m, const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? missing : it->second;
  };
  Options keys = a;
  keys.insert(b.begin(), b.end());
  for (const auto& kv : keys) {
    if (value(a, kv.first) != value(b, kv.first)) {
      return OptionDifference{kv.first, value(a, kv.first), value(b, kv.first)};
    }
  }
  return std::nullopt;
}

std::string cpu_half_precision_support() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string flags;
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) {  // x86, Arm
      // Padded with spaces in place: GCC 12 at -O3 (the CUDA wheel leg) warned
      // a false -Wrestrict on `" " + line.substr(...) + " "`.
      flags = line.substr(line.find(':') + 1);
      flags.insert(flags.begin(), ' ');
      flags.push_back(' ');
      break;
    }
  }
  auto has = [&flags](const char* flag) {
    return flags.find(std::string(" ") + flag + " ") != std::string::npos;
  };
  std::string named;
  const std::pair<const char*, const char*> kHalfFlags[] = {
      {"amx_bf16", "AMX-BF16"},        {"amx_fp16", "AMX-FP16"}, {"avx512_bf16", "AVX-512 BF16"},
      {"avx512_fp16", "AVX-512 FP16"}, {"bf16", "BF16"},         {"asimdhp", "FP16"}};
  for (const auto& [flag, name] : kHalfFlags) {
    if (has(flag)) {
      named += (named.empty() ? "" : ", ") + std::string(name);
    }
  }
  if (named.empty()) {
    named = has("avx512f")  ? "AVX-512 without BF16 or FP16"
            : has("avx2")   ? "AVX2 only"
            : flags.empty() ? "unknown"
                            : "no AVX2";
  }
  const bool bf16 = torchamp::cpu_has_fast(at::kBFloat16);
  const bool fp16 = torchamp::cpu_has_fast(at::kHalf);
  return named + ": " +
         (bf16 && fp16 ? "bfloat16 and float16 matmuls native"
          : bf16       ? "bfloat16 matmuls native, float16 not"
          : fp16       ? "float16 matmuls native, bfloat16 not"
                       : "neither bfloat16 nor float16 matmuls native");
}

std::string slow_here(const std::string& mode, std::initializer_list<at::ScalarType> dtypes) {
  for (const auto dtype : dtypes) {
    if ((dtype == at::kBFloat16 || dtype == at::kHalf) && !torchamp::cpu_has_fast(dtype)) {
      return mode + ": this CPU has no native " +
             (dtype == at::kBFloat16 ? "bfloat16" : "float16") +
             " matmuls, so ATen's run several times slower than float32's (4-5x a step in "
             "both apps' modes on AVX2 and Zen 4 VMs): expect this mode to take far longer "
             "than fp32\n";
    }
  }
  return "";
}

std::string default_data(const std::string& name, const std::string& built) {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path installed =
      exe.parent_path().parent_path() / "share" / "torchamp" / name;
  return !ec && std::filesystem::exists(installed) ? installed.string() : built;
}

int run_app(const char* app, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::invalid_argument& e) {
    std::cerr << app << ": error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << app << ": error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << app << ": error: " << e.what() << "\n";
    return 1;
  }
}

bool have_gnuplot() {
  return std::system("command -v gnuplot >/dev/null 2>&1") == 0;
}

bool run_gnuplot(const std::string& script_path) {
  return std::system(("gnuplot '" + script_path + "'").c_str()) == 0;
}

}  // namespace torchamp_apps
