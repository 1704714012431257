// The optimizer step, fused against LibTorch's own, in one run:
//   base_*      torch::optim::{SGD, AdamW}::step (a chain of ATen operations
//               per parameter);
//   fused_*     torchamp::optim::{SGD, AdamW}::step (one fused pass);
//   scaled_*    a training step's scaler work plus the step: scaler.step(opt)
//               (LibTorch's optimizer: unscale_ pass, then its step; ours: a
//               read-only check pass, then the fused step dividing each
//               gradient as it reads it and writing it back unscaled) and
//               scaler.update();
//   amp_adamw, unscaling_amp_adamw  the fused AdamW update alone, called as
//               scaler.step calls it (amp_step), without and with a
//               grad_scale: the second divides the gradients and writes them
//               back (one more stream); their ratio is the write-back's cost;
//   ceiling     the bytes an ideal fused AdamW moves (read parameter,
//               gradient and both moments, write parameter and both moments)
//               as a plain streaming loop with the same threads.
//   master_adamw_{bf16,f16}  torchamp::optim::AdamW with master weights on
//               bfloat16 / float16 parameters (float32 state; bfloat16's
//               master is an int16 remainder, float16's a float32 copy),
//               against fused_adamw and base_adamw on float32 parameters;
//               the second table gives each one's bytes per parameter
//               (parameters + gradients + optimizer state, summed over the
//               tensors that exist after a step) and its speed as a share
//               of the ceiling (bytes it must move / time, over the
//               ceiling's GB/s).
// Cases: float32 parameters, 1 x 64M, 1 x 16M, 100 x 160k, 10,000 x 100,
// 100,000 x 10. 1 x 64M's tensors (1 GiB in float32, 0.9 GiB with bfloat16
// masters) are well above a 260 MB last-level cache; 1 x 16M's (256 MB) are
// not. Master weights: 1 x 64M, 1 x 16M and 10,000 x 100.
// The table's "us/param" and "of ceiling" beside AdamW + scaler are the
// scaled fused step's time per parameter and the ceiling's time over it: on
// many small tensors they show the per-parameter bookkeeping (the ceiling's
// loop has none).
//
// With --device=cuda the parameters live on the GPU, torchamp's step is
// ATen's fused multi-tensor kernels, every step ends with a device
// synchronisation (for both), and the ceiling is a device-to-device copy of
// the same number of bytes.
//
// Run: ./build/bench/bench_optim [--threads=N] [--device=cuda] [--benchmark_repetitions=3]

#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include "bench_util.h"
#include "compat/compat.h"    // TORCHAMP_ATEN_FUSED_OPTIMIZERS
#include "kernels/kernels.h"  // TORCHAMP_TARGET_CLONES, as the kernels; cap_isa

#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Case {
  const char* name;
  int64_t tensors;
  int64_t elements;
};
const Case kCases[] = {{"1x64M", 1, 64 << 20},
                       {"1x16M", 1, 16 << 20},
                       {"100x160k", 100, 160 << 10},
                       {"10000x100", 10000, 100},
                       {"100000x10", 100000, 10}};

c10::Device g_device = c10::kCPU;

// Waits for the device's queued work (CUDA); nothing on the CPU.
void sync() {
  if (g_device.is_cuda()) {
    torch::cuda::synchronize();
  }
}

// Fresh parameters with gradients (fixed: the same every step).
std::vector<at::Tensor> make_params(const Case& c, at::ScalarType dtype = at::kFloat) {
  torch::manual_seed(0);
  std::vector<at::Tensor> ps;
  for (int64_t i = 0; i < c.tensors; ++i) {
    auto p = torch::randn({c.elements}).to(g_device, dtype);
    p.mutable_grad() = (torch::randn({c.elements}) * 1e-3).to(g_device, dtype);
    ps.push_back(p);
  }
  return ps;
}

double total_elements(const Case& c) {
  return static_cast<double>(c.tensors) * static_cast<double>(c.elements);
}

// Bytes an ideal fused AdamW moves per step: 4 reads + 3 writes of float32.
double adamw_bytes(const Case& c) {
  return total_elements(c) * 4.0 * 7.0;
}

template <class Opt, class Options>
void bm_step(benchmark::State& state, const Case& c, Options options) {
  auto ps = make_params(c);
  Opt opt(ps, options);
  opt.step();  // the first step creates the state: not timed
  sync();
  for (auto _ : state) {
    opt.step();
    sync();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * adamw_bytes(c)));
}

// Alternating scales 2 and 0.5: the unscale pass of the LibTorch path then
// leaves the gradients where they are, run after run.
template <class Opt, class Options>
void bm_scaled(benchmark::State& state, const Case& c, Options options) {
  auto ps = make_params(c);
  Opt opt(ps, options);
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(2.0));
  scaler.step(opt);  // the first step creates the state: not timed
  scaler.update(0.5);
  sync();
  int64_t i = 1;
  for (auto _ : state) {
    scaler.step(opt);
    scaler.update((i++ & 1) ? 2.0 : 0.5);
    sync();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * adamw_bytes(c)));
}

// The fused update as scaler.step calls it, without the scaler's check pass:
// with a grad_scale (2 and 0.5 alternating, so the gradients written back stay
// where they are) or without one.
template <class Opt, class Options>
void bm_amp_step(benchmark::State& state, const Case& c, Options options, bool unscale) {
  auto ps = make_params(c);
  Opt opt(ps, options);
  opt.step();  // the first step creates the state: not timed
  sync();
  int64_t i = 0;
  for (auto _ : state) {
    torchamp::AmpStepArgs args;
    if (unscale) {
      args.grad_scale = (i++ & 1) ? 0.5f : 2.0f;
    }
    opt.amp_step(args);
    sync();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * adamw_bytes(c)));
}

// Bytes per parameter of an AdamW optimizer over `ps` after a step, summed
// over the tensors that exist: parameters, gradients, the moments and the
// master weights' storage (the int64 step counts are not tensors).
double adamw_bytes_per_param(const torchamp::optim::AdamW& opt, const std::vector<at::Tensor>& ps) {
  double bytes = 0, n = 0;
  for (const auto& p : ps) {
    n += static_cast<double>(p.numel());
    bytes += static_cast<double>(p.nbytes() + p.grad().nbytes());
    const at::Tensor master = opt.master_weight_storage(p);
    bytes += master.defined() ? static_cast<double>(master.nbytes()) : 0.0;
  }
  for (const auto& kv : opt.state()) {
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*kv.second);
    bytes += static_cast<double>(st.exp_avg().nbytes() + st.exp_avg_sq().nbytes());
  }
  return bytes / n;
}

std::map<std::string, double> g_bytes_per_param;

// Bytes a master-weights AdamW step must move per element: bfloat16 reads
// the parameter, its remainder, the gradient and both moments (2+2+2+4+4)
// and writes all but the gradient (2+2+4+4); float16 reads the float32
// master instead of the parameter (2+4+4+4) and writes the parameter, master
// and moments (2+4+4+4).
double master_bytes(const Case& c, at::ScalarType dtype) {
  return total_elements(c) * (dtype == at::kBFloat16 ? 26.0 : 28.0);
}

void bm_master(benchmark::State& state, const Case& c, at::ScalarType dtype,
               torch::optim::AdamWOptions options, const std::string& name) {
  auto ps = make_params(c, dtype);
  torchamp::optim::AdamW opt(ps, options, torchamp::optim::FusedOptions().master_weights(true));
  opt.step();  // the first step creates the state and the masters: not timed
  g_bytes_per_param[name] = adamw_bytes_per_param(opt, ps);
  for (auto _ : state) {
    opt.step();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * master_bytes(c, dtype)));
}

// The float32 fused AdamW's bytes per parameter, for the table.
void note_f32_bytes(const Case& c, torch::optim::AdamWOptions options, const std::string& name) {
  if (g_device.is_cpu() && !g_bytes_per_param.count(name)) {
    auto ps = make_params(c);
    torchamp::optim::AdamW opt(ps, options);
    opt.step();
    g_bytes_per_param[name] = adamw_bytes_per_param(opt, ps);
  }
}

TORCHAMP_TARGET_CLONES void stream7(float* __restrict p, const float* __restrict g,
                                    float* __restrict m, float* __restrict v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    m[i] = m[i] * 0.9f + gi;
    v[i] = v[i] * 0.999f + gi;
    p[i] = p[i] * 0.5f + gi;
  }
}

void bm_ceiling(benchmark::State& state, const Case& c) {
  if (g_device.is_cuda()) {  // a copy of the same bytes: 3.5 floats per element each way
    const auto n = static_cast<int64_t>(total_elements(c) * 3.5);
    auto src = torch::ones({n}, torch::TensorOptions().device(g_device));
    auto dst = torch::empty_like(src);
    for (auto _ : state) {
      dst.copy_(src);
      sync();
    }
    state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * adamw_bytes(c)));
    return;
  }
  auto ps = make_params(c);
  std::vector<at::Tensor> ms, vs;
  for (auto& p : ps) {
    ms.push_back(torch::zeros_like(p));
    vs.push_back(torch::zeros_like(p));
  }
  const int64_t total = c.tensors * c.elements;
  for (auto _ : state) {
    at::parallel_for(0, total, 1 << 15, [&](int64_t b, int64_t e) {
      for (int64_t t = b / c.elements; t * c.elements < e; ++t) {
        const int64_t lo = std::max(b, t * c.elements) - t * c.elements;
        const int64_t hi = std::min(e, (t + 1) * c.elements) - t * c.elements;
        stream7(ps[t].data_ptr<float>() + lo, ps[t].grad().data_ptr<float>() + lo,
                ms[t].data_ptr<float>() + lo, vs[t].data_ptr<float>() + lo, hi - lo);
      }
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * adamw_bytes(c)));
}

// ---- interleaved ratios ----------------------------------------------------
//
// These machines are shared and their speed drifts within seconds, so the
// ratios the issue tracker asks for are measured here by running every
// variant of a case once per round, round after round, and taking medians:
//   fp32, bf16-master, fp16-master      torchamp AdamW's step() on float32,
//                                       bfloat16 and float16 parameters
//   ... +scaler                         the same with scaler.step + update
//   aten_adamw+scaler                   ATen's CPU _fused_adamw_ driven as
//                                       Python's GradScaler drives
//                                       AdamW(fused=True): the check pass
//                                       (inverse scale 1), the step count's
//                                       _foreach_add_, _fused_adamw_(grad_scale,
//                                       found_inf), _amp_update_scale_
//   sgd+scaler, aten_sgd+scaler         the same for SGD (momentum 0.9)
//   bf16-sr, bf16-nearest               AdamW on bfloat16 parameters and
//                                       state without masters: stochastic
//                                       rounding, and round to nearest
//   bf16-sr-f32state                    stochastic rounding, float32 state
//   fp32+device, bf16-master+device     (10000 x 100 only) the scaler's state
//                                       in tensors and the optimizer on
//                                       ATen's fused ops: what a CUDA step
//                                       runs (#61), here on the CPU
//   ...@avx2                            where the CPU has AVX-512: master
//                                       weights on the AVX2 loops instead
//                                       (kernels::cap_isa), what AVX-512 buys
// The scale alternates 2 and 0.5 (the fused steps write the gradients back
// divided by it; a fixed scale would drive them subnormal within rounds).
struct Variant {
  std::string name;
  std::function<void()> step;
};

template <class Opt, class Options>
Variant scaled_variant(const std::string& name, std::vector<at::Tensor> ps, Options options,
                       torchamp::optim::FusedOptions fused = {}, bool device_state = false) {
  auto opt = std::make_shared<Opt>(ps, options, fused);
  auto scaler = std::make_shared<torchamp::GradScaler>(
      torchamp::GradScalerOptions().init_scale(2.0).device_state(device_state));
  scaler->step(*opt);
  scaler->update(0.5);
  auto i = std::make_shared<int64_t>(1);
  return {name, [opt, scaler, i, ps] {
            scaler->step(*opt);
            scaler->update(((*i)++ & 1) ? 2.0 : 0.5);
          }};
}

template <class Opt, class Options>
Variant plain_variant(const std::string& name, std::vector<at::Tensor> ps, Options options,
                      torchamp::optim::FusedOptions fused = {}) {
  auto opt = std::make_shared<Opt>(ps, options, fused);
  opt->step();
  return {name, [opt, ps] { opt->step(); }};
}

#if TORCHAMP_ATEN_FUSED_OPTIMIZERS
// Python's GradScaler around a fused optimizer, its ATen calls from C++.
struct AtenScaled {
  std::vector<at::Tensor> ps, grads, a, b, none, steps;
  at::Tensor scale = torch::full({}, 2.0f), tracker = torch::zeros({}, torch::kInt);
  int64_t i = 0;
  explicit AtenScaled(std::vector<at::Tensor> params, bool moments) : ps(std::move(params)) {
    for (auto& p : ps) {
      grads.push_back(p.grad());
      a.push_back(torch::zeros_like(p));
      if (moments) {
        b.push_back(torch::zeros_like(p));
      }
      steps.push_back(torch::zeros({}));
    }
  }
  at::Tensor check() {
    auto found_inf = torch::zeros({});
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch::ones({}));
    return found_inf;
  }
  void update(const at::Tensor& found_inf) {
    at::_amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000);
    scale.fill_((i++ & 1) ? 2.0 : 0.5);  // (as the torchamp variants' update(new_scale))
  }
};
#endif

// `v` on the AVX2 loops (the kernels' cap lowered for its step alone).
Variant on_avx2(Variant v) {
  return {v.name + "@avx2", [step = std::move(v.step)] {
            const auto cap = torchamp::kernels::isa_cap();
            torchamp::kernels::cap_isa(torchamp::kernels::Isa::avx2);
            step();
            torchamp::kernels::cap_isa(cap);
          }};
}

void run_interleaved(const Case& c, int rounds, std::vector<std::string>& others,
                     std::vector<std::string>& isas, std::vector<std::string>& srs,
                     std::vector<std::string>& devices) {
  const auto adamw = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  const auto sgd = torch::optim::SGDOptions(1e-3).momentum(0.9);
  const auto masters = torchamp::optim::FusedOptions().master_weights(true);
  const auto adam = torch::optim::AdamOptions(1e-3);
  // The master-weight variants: AdamW alone and with the scaler; Adam and
  // SGD with master weights, against their own float32 steps.
  std::vector<Variant> vs;
  for (const auto& [dtype, name] :
       {std::pair{at::kBFloat16, "bf16"}, std::pair{at::kHalf, "fp16"}}) {
    const std::string n = name;
    vs.push_back(plain_variant<torchamp::optim::AdamW>(n + "-master", make_params(c, dtype), adamw,
                                                       masters));
    vs.push_back(scaled_variant<torchamp::optim::AdamW>(n + "-master+scaler", make_params(c, dtype),
                                                        adamw, masters));
    vs.push_back(plain_variant<torchamp::optim::Adam>("adam-" + n + "-master",
                                                      make_params(c, dtype), adam, masters));
    vs.push_back(plain_variant<torchamp::optim::SGD>("sgd-" + n + "-master", make_params(c, dtype),
                                                     sgd, masters));
  }
  // Stochastic rounding (no masters; bfloat16 state, and float32 state) and
  // plain bfloat16, with their bytes per parameter after a step.
  std::map<std::string, double> bytes;
  for (const char* name : {"bf16-sr", "bf16-sr-f32state", "bf16-nearest"}) {
    const std::string n = name;
    auto fused = torchamp::optim::FusedOptions().stochastic_rounding(n != "bf16-nearest");
    if (n == "bf16-sr-f32state") {
      fused.state_dtype(at::kFloat);
    }
    auto ps = make_params(c, at::kBFloat16);
    auto opt = std::make_shared<torchamp::optim::AdamW>(ps, adamw, fused);
    opt->step();
    bytes[name] = adamw_bytes_per_param(*opt, ps);
    vs.push_back({name, [opt, ps] { opt->step(); }});
  }
  {
    auto ps = make_params(c, at::kBFloat16);
    torchamp::optim::AdamW opt(ps, adamw, masters);
    opt.step();
    bytes["bf16-master"] = adamw_bytes_per_param(opt, ps);
  }
  // The same steps (the same optimizers: no more memory) on the AVX2 loops,
  // where AVX-512 runs them.
  const bool avx512 = torchamp::kernels::vector_isa() == torchamp::kernels::Isa::avx512;
  if (avx512) {
    for (size_t k = 0, n = vs.size(); k < n; ++k) {
      vs.push_back(on_avx2(vs[k]));
    }
  }
  vs.push_back(plain_variant<torchamp::optim::AdamW>("fp32", make_params(c), adamw));
  vs.push_back(scaled_variant<torchamp::optim::AdamW>("fp32+scaler", make_params(c), adamw));
  vs.push_back(scaled_variant<torchamp::optim::SGD>("sgd+scaler", make_params(c), sgd));
  {  // LibTorch's own AdamW under the same scaler: unscale_ pass, then its step
    auto ps = make_params(c);
    auto opt = std::make_shared<torch::optim::AdamW>(ps, adamw);
    auto scaler =
        std::make_shared<torchamp::GradScaler>(torchamp::GradScalerOptions().init_scale(2.0));
    auto i = std::make_shared<int64_t>(0);
    vs.push_back({"libtorch_adamw+scaler", [opt, scaler, i, ps] {
                    scaler->step(*opt);
                    scaler->update(((*i)++ & 1) ? 2.0 : 0.5);
                  }});
  }
  vs.push_back(plain_variant<torchamp::optim::Adam>("adam-fp32", make_params(c), adam));
  vs.push_back(plain_variant<torchamp::optim::SGD>("sgd-fp32", make_params(c), sgd));
#if TORCHAMP_ATEN_FUSED_OPTIMIZERS
  // The device path: many small tensors only (its kernels per tensor are
  // what it adds; 1 x 64M has no room for two more copies on 24 GB).
  const bool device_path = c.tensors > 1;
  if (device_path) {
    const auto aten = torchamp::optim::FusedOptions().aten_kernels(true);
    vs.push_back(
        scaled_variant<torchamp::optim::AdamW>("fp32+device", make_params(c), adamw, aten, true));
    vs.push_back(scaled_variant<torchamp::optim::AdamW>(
        "bf16-master+device", make_params(c, at::kBFloat16), adamw,
        torchamp::optim::FusedOptions(aten).master_weights(true), true));
    const auto sr = torchamp::optim::FusedOptions().stochastic_rounding(true);
    vs.push_back(scaled_variant<torchamp::optim::AdamW>("bf16-sr+scaler",
                                                        make_params(c, at::kBFloat16), adamw, sr));
    vs.push_back(scaled_variant<torchamp::optim::AdamW>(
        "bf16-sr+device", make_params(c, at::kBFloat16), adamw,
        torchamp::optim::FusedOptions(sr).aten_kernels(true), true));
  }
  {
    auto st = std::make_shared<AtenScaled>(make_params(c), true);
    vs.push_back({"aten_adamw+scaler", [st] {
                    const auto found_inf = st->check();
                    at::_foreach_add_(st->steps, 1);
                    at::_fused_adamw_(st->ps, st->grads, st->a, st->b, st->none, st->steps, 1e-3,
                                      0.9, 0.999, 0.01, 1e-8, false, false, st->scale, found_inf);
                    st->update(found_inf);
                  }});
  }
  {
    auto st = std::make_shared<AtenScaled>(make_params(c), false);
    auto first = std::make_shared<bool>(true);
    vs.push_back({"aten_sgd+scaler", [st, first] {
                    const auto found_inf = st->check();
                    at::_fused_sgd_(st->ps, st->grads, st->a, 0.0, 0.9, 1e-3, 0.0, false, false,
                                    *first, st->scale, found_inf);
                    *first = false;
                    st->update(found_inf);
                  }});
  }
#endif
  for (auto& v : vs) {
    v.step();  // warm-up
  }
  std::map<std::string, std::vector<double>> ms;
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < vs.size(); ++k) {
      auto& v = vs[(k + static_cast<size_t>(r)) % vs.size()];  // a rotating order
      const auto t0 = std::chrono::steady_clock::now();
      v.step();
      ms[v.name].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::map<std::string, double> med;
  for (auto& [name, t] : ms) {
    std::sort(t.begin(), t.end());
    med[name] = t[t.size() / 2];
  }
  auto speed = [&](const char* a, const char* b) {  // b's time over a's: a's speed as b's
    return med.count(a) && med.count(b) ? med[b] / med[a] : 0.0;
  };
  std::printf("| %s | %.2f | %.2f | %.2fx | %.2fx | %.2fx | %.2fx |", c.name, med["fp32"],
              med["fp32+scaler"], speed("bf16-master", "fp32"), speed("fp16-master", "fp32"),
              speed("bf16-master+scaler", "fp32+scaler"),
              speed("fp16-master+scaler", "fp32+scaler"));
  if (med.count("aten_adamw+scaler")) {
    std::printf(" %.2f | %.2fx | %.2f | %.2fx |", med["aten_adamw+scaler"],
                speed("fp32+scaler", "aten_adamw+scaler"), med["aten_sgd+scaler"],
                speed("sgd+scaler", "aten_sgd+scaler"));
  } else {
    std::printf(" n/a | n/a | n/a | n/a |");
  }
  std::printf(" %.2f | %.2fx |\n", med["libtorch_adamw+scaler"],
              speed("fp32+scaler", "libtorch_adamw+scaler"));
  char row[256];
  std::snprintf(row, sizeof row, "| %s | %.2f | %.2fx | %.2fx | %.2f | %.2fx | %.2fx |", c.name,
                med["adam-fp32"], speed("adam-bf16-master", "adam-fp32"),
                speed("adam-fp16-master", "adam-fp32"), med["sgd-fp32"],
                speed("sgd-bf16-master", "sgd-fp32"), speed("sgd-fp16-master", "sgd-fp32"));
  others.push_back(row);
  char isa_gain[16] = "n/a";  // no AVX2 twin where the CPU has no AVX-512
  if (avx512) {
    std::snprintf(isa_gain, sizeof isa_gain, "%.2fx", speed("bf16-sr", "bf16-sr@avx2"));
  }
  std::snprintf(row, sizeof row,
                "| %s | %.2f | %.2f | %.2fx | %.2fx | %.2fx | %s | %.1f | %.1f | %.2fx | %.1f |",
                c.name, med["bf16-master"], med["bf16-sr"], speed("bf16-sr", "bf16-master"),
                speed("bf16-sr", "fp32"), speed("bf16-nearest", "bf16-sr"), isa_gain,
                bytes["bf16-master"], bytes["bf16-sr"], speed("bf16-sr-f32state", "bf16-master"),
                bytes["bf16-sr-f32state"]);
  srs.push_back(row);
  if (med.count("fp32+device")) {
    std::snprintf(row, sizeof row, "| %s | %.2f | %.2fx | %.2fx | %.2f | %.2fx | %.2f | %.2fx |",
                  c.name, med["fp32+device"], speed("fp32+device", "aten_adamw+scaler"),
                  speed("fp32+device", "fp32+scaler"), med["bf16-master+device"],
                  speed("bf16-master+device", "bf16-master+scaler"), med["bf16-sr+device"],
                  speed("bf16-sr+device", "bf16-sr+scaler"));
    devices.push_back(row);
  }
  if (avx512) {
    const auto gain = [&](const std::string& v) { return speed(v.c_str(), (v + "@avx2").c_str()); };
    std::snprintf(row, sizeof row,
                  "| %s | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx |", c.name,
                  gain("bf16-master"), gain("fp16-master"), gain("bf16-master+scaler"),
                  gain("fp16-master+scaler"), gain("adam-bf16-master"), gain("adam-fp16-master"),
                  gain("sgd-bf16-master"), gain("sgd-fp16-master"));
    isas.push_back(row);
  }
}

// A table's heading and its rows, one per case.
void print_table(const char* heading, const std::vector<std::string>& rows) {
  std::printf("%s", heading);
  for (const auto& row : rows) {
    std::printf("%s\n", row.c_str());
  }
}

void interleaved(int rounds_large, int rounds_small) {
  std::printf(
      "\nInterleaved (%d threads, LibTorch %s; medians of rounds, every variant once per round; "
      "speeds as the float32 fused step's time over theirs, ATen's as its time over torchamp's)\n"
      "| case | fp32 AdamW ms | fp32 AdamW+scaler ms | bf16 master | fp16 master | bf16 master "
      "+scaler | fp16 master +scaler | ATen _fused_adamw_+scaler ms | torchamp vs ATen | ATen "
      "_fused_sgd_+scaler ms | torchamp SGD vs ATen | LibTorch AdamW+scaler ms | torchamp vs "
      "LibTorch |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      at::get_num_threads(), TORCH_VERSION);
  std::vector<std::string> others, isas, srs, devices;
  for (const auto& c : kCases) {
    if (std::string(c.name) == "1x64M" || std::string(c.name) == "10000x100") {
      run_interleaved(c, c.tensors == 1 ? rounds_large : rounds_small, others, isas, srs, devices);
    }
  }
  if (!devices.empty()) {
    print_table(
        "\nThe device path on the CPU: AdamW + GradScaler with the scaler's state in tensors "
        "(device_state) and the optimizer on ATen's fused ops (aten_kernels), what a CUDA step "
        "runs; speeds as the other's time over its: ATen's calls as Python's GradScaler + "
        "AdamW(fused=True) make them, and torchamp's CPU path (host scaler, its own kernels)\n"
        "| case | fp32 device path ms | vs Python's ATen calls | vs torchamp's CPU path | bf16 "
        "master device path ms | vs bf16 master CPU path | bf16 stochastic device path ms | vs "
        "bf16 stochastic CPU path |\n|---|---|---|---|---|---|---|---|\n",
        devices);
  }
  print_table(
      "\nAdam and SGD (momentum 0.9) with master weights, the same rounds; speeds as each "
      "optimizer's float32 fused step's time over theirs\n"
      "| case | Adam fp32 ms | Adam bf16 master | Adam fp16 master | SGD fp32 ms | SGD bf16 master "
      "| SGD fp16 master |\n|---|---|---|---|---|---|---|\n",
      others);
  print_table(
      "\nAdamW on bfloat16 parameters without masters, stochastic rounding (bfloat16 state), the "
      "same rounds; speeds as the other step's time over stochastic rounding's; bytes per "
      "parameter from the tensors after a step\n"
      "| case | bf16 master ms | bf16 stochastic ms | vs master | vs fp32 | round-to-nearest vs "
      "stochastic | AVX-512 vs AVX2 | bytes/param master | bytes/param stochastic | float32 "
      "state vs master | bytes/param float32 state |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n",
      srs);
  std::printf("\nMaster weights' vector loops: %s (kernels::vector_isa())\n",
              torchamp::kernels::isa_name(torchamp::kernels::vector_isa()));
  if (!isas.empty()) {
    print_table(
        "AVX-512's speed as the AVX2 loops' time over its own, the same steps and rounds\n"
        "| case | AdamW bf16 | AdamW fp16 | AdamW bf16 +scaler | AdamW fp16 +scaler | Adam bf16 | "
        "Adam fp16 | SGD bf16 | SGD fp16 |\n|---|---|---|---|---|---|---|---|---|\n",
        isas);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool only_interleaved = false;
  const int threads = torchamp_bench::init(
      argc, argv, "0.3", {"--device=", "--interleaved"}, [&](const std::string& a) {
        if (a == "--interleaved") {
          only_interleaved = true;
          return;
        }
        try {
          g_device = c10::Device(a.substr(9));
        } catch (const c10::Error& e) {
          std::fprintf(stderr, "bench_optim: %s: %s\n", a.c_str(), e.what_without_backtrace());
          std::exit(2);
        }
      });
  if (g_device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "bench_optim: --device=%s, but this LibTorch sees no CUDA device\n",
                 g_device.str().c_str());
    return 2;
  }
  at::set_num_threads(threads);
  if (only_interleaved) {  // the interleaved ratios alone
    interleaved(9, 31);
    return 0;
  }

  const auto adamw = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  const auto sgd = torch::optim::SGDOptions(1e-3).momentum(0.9);
  for (const auto& c : kCases) {
    const std::string s = std::string("/") + c.name;
    auto reg = [](const std::string& name, auto fn) {
      benchmark::RegisterBenchmark(name.c_str(), fn)->UseRealTime()->Unit(benchmark::kNanosecond);
    };
    reg("base_adamw" + s,
        [c, adamw](benchmark::State& st) { bm_step<torch::optim::AdamW>(st, c, adamw); });
    reg("fused_adamw" + s,
        [c, adamw](benchmark::State& st) { bm_step<torchamp::optim::AdamW>(st, c, adamw); });
    reg("amp_adamw" + s, [c, adamw](benchmark::State& st) {
      bm_amp_step<torchamp::optim::AdamW>(st, c, adamw, false);
    });
    reg("unscaling_amp_adamw" + s, [c, adamw](benchmark::State& st) {
      bm_amp_step<torchamp::optim::AdamW>(st, c, adamw, true);
    });
    reg("scaled_base_adamw" + s,
        [c, adamw](benchmark::State& st) { bm_scaled<torch::optim::AdamW>(st, c, adamw); });
    reg("scaled_fused_adamw" + s,
        [c, adamw](benchmark::State& st) { bm_scaled<torchamp::optim::AdamW>(st, c, adamw); });
    reg("base_sgd" + s, [c, sgd](benchmark::State& st) { bm_step<torch::optim::SGD>(st, c, sgd); });
    reg("fused_sgd" + s,
        [c, sgd](benchmark::State& st) { bm_step<torchamp::optim::SGD>(st, c, sgd); });
    reg("ceiling" + s, [c](benchmark::State& st) { bm_ceiling(st, c); });
    const bool master_case = c.tensors == 1 || c.tensors == 10000;
    if (master_case && g_device.is_cpu()) {  // master weights: torchamp's CPU kernels only
      for (auto dtype : {at::kBFloat16, at::kHalf}) {
        const std::string name =
            std::string(dtype == at::kBFloat16 ? "master_adamw_bf16" : "master_adamw_f16") + s;
        reg(name, [c, adamw, dtype, name](benchmark::State& st) {
          bm_master(st, c, dtype, adamw, name);
        });
      }
    }
  }
  torchamp_bench::Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  auto& t = collector.seconds;
  std::printf(
      "\nLibTorch %s, %s, %d threads, float32 parameters; times in ms per step (medians)\n"
      "| case | AdamW + scaler: LibTorch | torchamp | speedup | us/param | of ceiling | AdamW "
      "alone: LibTorch | torchamp | speedup | fused AdamW GB/s | of ceiling | SGD(momentum) "
      "alone: LibTorch | torchamp | speedup | grad write-back "
      "|\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      TORCH_VERSION, g_device.str().c_str(), at::get_num_threads());
  for (const auto& c : kCases) {
    const std::string s = std::string("/") + c.name;
    if (!t.count("fused_adamw" + s) || !t.count("base_adamw" + s)) {
      continue;
    }
    auto ms = [&](const std::string& k) { return t.count(k) ? t[k] * 1e3 : 0.0; };
    const double fused = t["fused_adamw" + s];
    const double gbps = adamw_bytes(c) / fused / 1e9;
    const double ceiling = t.count("ceiling" + s) ? adamw_bytes(c) / t["ceiling" + s] / 1e9 : 0;
    const double scaled = ms("scaled_fused_adamw" + s);
    std::printf(
        "| %s | %.3f | %.3f | %.1fx | %.3f | %.2f | %.3f | %.3f | %.1fx | %.1f | %.2f | %.3f | "
        "%.3f "
        "| %.1fx | %+.0f%% |\n",
        c.name, ms("scaled_base_adamw" + s), scaled, ms("scaled_base_adamw" + s) / scaled,
        1e3 * scaled / static_cast<double>(c.tensors),
        t.count("ceiling" + s) ? ms("ceiling" + s) / scaled : 0.0, ms("base_adamw" + s),
        ms("fused_adamw" + s), ms("base_adamw" + s) / ms("fused_adamw" + s), gbps,
        ceiling > 0 ? gbps / ceiling : 0.0, ms("base_sgd" + s), ms("fused_sgd" + s),
        ms("base_sgd" + s) / ms("fused_sgd" + s),
        (ms("unscaling_amp_adamw" + s) / ms("amp_adamw" + s) - 1) * 100);
  }
  if (g_device.is_cpu()) {
    std::printf(
        "\nMaster weights (AdamW, %d threads): ms per step (medians), bytes per parameter "
        "(parameters + gradients + state, from the tensors), GB/s of the bytes each must move "
        "and that over the ceiling's\n"
        "| case | parameters | ms | vs float32 fused | vs LibTorch float32 | bytes/param | GB/s | "
        "of ceiling |\n|---|---|---|---|---|---|---|---|\n",
        at::get_num_threads());
    for (const auto& c : kCases) {
      const std::string s = std::string("/") + c.name;
      if (!t.count("master_adamw_bf16" + s) || !t.count("fused_adamw" + s)) {
        continue;
      }
      note_f32_bytes(c, adamw, "fused_adamw" + s);
      const double ceiling = t.count("ceiling" + s) ? adamw_bytes(c) / t["ceiling" + s] / 1e9 : 0;
      auto row = [&](const char* label, const std::string& key, double bytes) {
        const double gbps = bytes / t[key] / 1e9;
        std::printf("| %s | %s | %.3f | %.2fx | %.2fx | %.1f | %.1f | %.2f |\n", c.name, label,
                    t[key] * 1e3, t["fused_adamw" + s] / t[key], t["base_adamw" + s] / t[key],
                    g_bytes_per_param[key], gbps, ceiling > 0 ? gbps / ceiling : 0.0);
      };
      row("float32 (fused)", "fused_adamw" + s, adamw_bytes(c));
      row("bfloat16 + master (remainder)", "master_adamw_bf16" + s, master_bytes(c, at::kBFloat16));
      row("float16 + master (float32 copy)", "master_adamw_f16" + s, master_bytes(c, at::kHalf));
    }
  }
  benchmark::Shutdown();
  return 0;
}
