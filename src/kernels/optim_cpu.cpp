// Fused optimizer kernels: the arithmetic of LibTorch's C++ SGD, Adam and
// AdamW steps (torch/csrc/api/src/optim/{sgd,adam,adamw}.cpp), element by
// element in one loop per parameter instead of a chain of ATen operations,
// with the loss scale's division folded into the gradient read (and the
// unscaled gradient written back in the same pass, as ATen's fused ops). Built with
// -O3 -fno-math-errno (so that sqrt vectorises) and cloned for AVX2 like the
// unscale loops.

#include "optim_kernels.h"

#include "bf16.h"
#include "kernels.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace torchamp {
namespace kernels {
namespace {

// Element storage: load() widens to the compute type M, store() rounds once.
template <class S>
struct Io {
  using T = S;
  using M = S;
  static M load(const S* p, int64_t i) { return p[i]; }
  static void store(S* p, int64_t i, M v) { p[i] = v; }
};
struct Bf16 {  // bfloat16 bits, rounded to nearest even (c10::BFloat16)
  using T = uint16_t;
  using M = float;
  static float load(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(uint16_t* p, int64_t i, float v) { p[i] = float_to_bf16(v); }
};
struct F16 {  // float16 bits, converted exactly as c10::Half
  using T = uint16_t;
  using M = float;
  static float load(const uint16_t* p, int64_t i) { return f16_to_float(p[i]); }
  static void store(uint16_t* p, int64_t i, float v) { p[i] = float_to_f16(v); }
};

// How the update reads and writes a parameter's value (in M).
template <class E>
struct PlainParam {  // the parameter is the value
  using M = typename E::M;
  typename E::T* __restrict p;
  explicit PlainParam(const void* param, const void* /*master*/)
      : p(static_cast<typename E::T*>(const_cast<void*>(param))) {}
  M load(int64_t i) const { return E::load(p, i); }
  void store(int64_t i, M v) { E::store(p, i, v); }
};

// A bfloat16 parameter whose float32 master is its own 16 bits and a signed
// 16-bit remainder: master bits = (param << 16) + remainder. Storing splits
// the master's bits so that this holds exactly: the parameter is the high
// half, plus one where the low half is 0x8000 or more (the remainder is then
// that low half minus 0x10000). That is rounding to nearest with ties away
// from zero: each bfloat16 value then stands for exactly 65,536 float32 bit
// patterns, which round to nearest even (65,535 or 65,537) cannot give.
struct Bf16Master {
  using M = float;
  uint16_t* __restrict p;
  int16_t* __restrict r;
  Bf16Master(const void* param, const void* remainder)
      : p(static_cast<uint16_t*>(const_cast<void*>(param))),
        r(static_cast<int16_t*>(const_cast<void*>(remainder))) {}
  float load(int64_t i) const {
    return float_of((static_cast<uint32_t>(p[i]) << 16) +
                    static_cast<uint32_t>(static_cast<int32_t>(r[i])));
  }
  void store(int64_t i, float v) {
    const uint32_t b = bits_of(v);
    const auto rem = static_cast<int16_t>(static_cast<uint16_t>(b & 0xffffu));
    p[i] = static_cast<uint16_t>((b >> 16) + (rem < 0 ? 1u : 0u));
    r[i] = rem;
  }
};

// A float16 parameter with a full float32 master; the parameter is the
// master rounded to nearest even.
struct F16Master {
  using M = float;
  uint16_t* __restrict p;
  float* __restrict m;
  F16Master(const void* param, const void* master)
      : p(static_cast<uint16_t*>(const_cast<void*>(param))),
        m(static_cast<float*>(const_cast<void*>(master))) {}
  float load(int64_t i) const { return m[i]; }
  void store(int64_t i, float v) {
    m[i] = v;
    p[i] = float_to_f16(v);
  }
};

// The gradient as the update reads it: divided by the loss scale and written
// back divided (kUnscale, as ATen's fused ops with a grad_scale), else as is.
template <class G, bool kUnscale>
__attribute__((always_inline)) inline typename G::M read_grad(typename G::T* __restrict g,
                                                              int64_t i, typename G::M scale) {
  auto gi = G::load(g, i);
  if (kUnscale) {
    gi = gi / scale;
    G::store(g, i, gi);
  }
  return gi;
}

// A kind of parameter the kernels take: P, the parameter's access; G, the
// gradient's storage; S, the state's.
template <class P_, class G_, class S_>
struct Kind {
  using P = P_;
  using G = G_;
  using S = S_;
};
using KindF32 = Kind<PlainParam<Io<float>>, Io<float>, Io<float>>;
using KindF64 = Kind<PlainParam<Io<double>>, Io<double>, Io<double>>;
using KindBf16 = Kind<PlainParam<Bf16>, Bf16, Bf16>;
using KindF16 = Kind<PlainParam<F16>, F16, F16>;
using KindBf16Master = Kind<Bf16Master, Bf16, Io<float>>;
using KindF16Master = Kind<F16Master, F16, Io<float>>;

template <class K, bool kDecoupled, bool kAmsgrad, bool kUnscale>
__attribute__((always_inline)) inline void adam_loop(const AdamJob& j, int64_t b, int64_t e,
                                                     float grad_scale) {
  using P = typename K::P;
  using G = typename K::G;
  using S = typename K::S;
  using M = typename P::M;
  P p(j.param, j.master);
  auto* __restrict g = static_cast<typename G::T*>(j.grad);
  auto* __restrict m = static_cast<typename S::T*>(j.exp_avg);
  auto* __restrict v = static_cast<typename S::T*>(j.exp_avg_sq);
  auto* __restrict vmax = static_cast<typename S::T*>(j.max_exp_avg_sq);
  // As ATen rounds its Scalars to the tensor's compute type.
  const M scale = static_cast<M>(grad_scale);
  const M beta1 = static_cast<M>(j.beta1), one_minus_beta1 = static_cast<M>(1 - j.beta1);
  const M beta2 = static_cast<M>(j.beta2), one_minus_beta2 = static_cast<M>(1 - j.beta2);
  const M eps = static_cast<M>(j.eps), bc2_sqrt = static_cast<M>(j.bias_correction2_sqrt);
  const M neg_step_size = static_cast<M>(-j.step_size);
  const M wd = static_cast<M>(j.weight_decay);
  const M decay = static_cast<M>(1 - j.lr * j.weight_decay);
  const bool has_wd = j.weight_decay != 0;
  for (int64_t i = b; i < e; ++i) {
    M gi = read_grad<G, kUnscale>(g, i, scale);
    M pi = p.load(i);
    if (has_wd) {
      if (kDecoupled) {
        pi = pi * decay;  // param.mul_(1 - lr * weight_decay)
      } else {
        gi = gi + wd * pi;  // grad.add(param, weight_decay)
      }
    }
    const M mi = S::load(m, i) * beta1 + one_minus_beta1 * gi;
    const M vi = S::load(v, i) * beta2 + one_minus_beta2 * gi * gi;
    M vd = vi;
    if (kAmsgrad) {
      vd = std::max(S::load(vmax, i), vi);  // max_out(max_exp_avg_sq, exp_avg_sq, ...)
      S::store(vmax, i, vd);
    }
    const M denom = std::sqrt(vd) / bc2_sqrt + eps;
    pi = pi + neg_step_size * mi / denom;  // param.addcdiv_(exp_avg, denom, -step_size)
    // Each stored tensor rounded once (16-bit storage); the update used the unrounded values.
    S::store(m, i, mi);
    S::store(v, i, vi);
    p.store(i, pi);
  }
}

// The clones: target_clones does not apply to templates, so one plain
// function per instantiation; NAME(j, b, e, scale) with or without the unscale.
#define TORCHAMP_ADAM_LOOP(NAME, KIND, DECOUPLED, AMSGRAD)                                      \
  TORCHAMP_TARGET_CLONES void NAME(const AdamJob& j, int64_t b, int64_t e, float s) {           \
    adam_loop<KIND, DECOUPLED, AMSGRAD, false>(j, b, e, s);                                     \
  }                                                                                             \
  TORCHAMP_TARGET_CLONES void NAME##_unscale(const AdamJob& j, int64_t b, int64_t e, float s) { \
    adam_loop<KIND, DECOUPLED, AMSGRAD, true>(j, b, e, s);                                      \
  }
#define TORCHAMP_ADAM_LOOPS(NAME, KIND)                    \
  TORCHAMP_ADAM_LOOP(adam_##NAME, KIND, false, false)      \
  TORCHAMP_ADAM_LOOP(adam_##NAME##_ams, KIND, false, true) \
  TORCHAMP_ADAM_LOOP(adamw_##NAME, KIND, true, false)      \
  TORCHAMP_ADAM_LOOP(adamw_##NAME##_ams, KIND, true, true)
TORCHAMP_ADAM_LOOPS(f32, KindF32)
TORCHAMP_ADAM_LOOPS(f64, KindF64)
TORCHAMP_ADAM_LOOPS(bf16, KindBf16)
TORCHAMP_ADAM_LOOPS(f16, KindF16)
TORCHAMP_ADAM_LOOPS(bf16_master, KindBf16Master)
TORCHAMP_ADAM_LOOPS(f16_master, KindF16Master)
#undef TORCHAMP_ADAM_LOOPS
#undef TORCHAMP_ADAM_LOOP

// A job's kind: the first index of the loop tables below.
int kind_of(at::ScalarType dtype, const void* master) {
  switch (dtype) {
    case at::kFloat:
      return 0;
    case at::kDouble:
      return 1;
    case at::kBFloat16:
      return master != nullptr ? 4 : 2;
    case at::kHalf:
      return master != nullptr ? 5 : 3;
    default:
      TORCH_INTERNAL_ASSERT(false, "unreachable dtype ", dtype);
  }
}

using AdamLoop = void (*)(const AdamJob&, int64_t, int64_t, float);

#define TORCHAMP_ADAM_ROW(NAME)                                                             \
  {                                                                                         \
    {{adam_##NAME, adam_##NAME##_unscale}, {adam_##NAME##_ams, adam_##NAME##_ams_unscale}}, \
        {{adamw_##NAME, adamw_##NAME##_unscale},                                            \
         {adamw_##NAME##_ams, adamw_##NAME##_ams_unscale}},                                 \
  }

// The loop for a job: [kind][decoupled][amsgrad][unscale].
AdamLoop adam_loop_for(const AdamJob& j, bool unscale) {
  static const AdamLoop kLoops[6][2][2][2] = {
      TORCHAMP_ADAM_ROW(f32), TORCHAMP_ADAM_ROW(f64),         TORCHAMP_ADAM_ROW(bf16),
      TORCHAMP_ADAM_ROW(f16), TORCHAMP_ADAM_ROW(bf16_master), TORCHAMP_ADAM_ROW(f16_master),
  };
  TORCH_INTERNAL_ASSERT(j.master == nullptr || j.dtype == at::kBFloat16 || j.dtype == at::kHalf,
                        "a master weight for a ", j.dtype, " parameter");
  return kLoops[kind_of(j.dtype, j.master)][j.decoupled][j.max_exp_avg_sq != nullptr][unscale];
}
#undef TORCHAMP_ADAM_ROW

template <class K, bool kUnscale>
__attribute__((always_inline)) inline void sgd_loop(const SgdJob& j, int64_t b, int64_t e,
                                                    float grad_scale) {
  using P = typename K::P;
  using G = typename K::G;
  using S = typename K::S;
  using M = typename P::M;
  P p(j.param, j.master);
  auto* __restrict g = static_cast<typename G::T*>(j.grad);
  auto* __restrict buf = static_cast<typename S::T*>(j.momentum_buffer);
  const M scale = static_cast<M>(grad_scale);
  const M wd = static_cast<M>(j.weight_decay);
  const M momentum = static_cast<M>(j.momentum);
  const M one_minus_dampening = static_cast<M>(1 - j.dampening);
  const M neg_lr = static_cast<M>(-1 * j.lr);
  const bool has_wd = j.weight_decay != 0, has_momentum = buf != nullptr, first = j.first,
             nesterov = j.nesterov;
  for (int64_t i = b; i < e; ++i) {
    M d = read_grad<G, kUnscale>(g, i, scale);
    const M pi = p.load(i);
    if (has_wd) {
      d = d + wd * pi;  // d_p.add(param, weight_decay)
    }
    if (has_momentum) {
      // First step: clone(d_p); then buf.mul_(momentum).add_(d_p, 1 - dampening).
      const M bi = first ? d : S::load(buf, i) * momentum + one_minus_dampening * d;
      S::store(buf, i, bi);
      d = nesterov ? d + momentum * bi : bi;
    }
    p.store(i, pi + neg_lr * d);
  }
}

#define TORCHAMP_SGD_LOOP(NAME, KIND)                                                          \
  TORCHAMP_TARGET_CLONES void NAME(const SgdJob& j, int64_t b, int64_t e, float s) {           \
    sgd_loop<KIND, false>(j, b, e, s);                                                         \
  }                                                                                            \
  TORCHAMP_TARGET_CLONES void NAME##_unscale(const SgdJob& j, int64_t b, int64_t e, float s) { \
    sgd_loop<KIND, true>(j, b, e, s);                                                          \
  }
TORCHAMP_SGD_LOOP(sgd_f32, KindF32)
TORCHAMP_SGD_LOOP(sgd_f64, KindF64)
TORCHAMP_SGD_LOOP(sgd_bf16, KindBf16)
TORCHAMP_SGD_LOOP(sgd_f16, KindF16)
TORCHAMP_SGD_LOOP(sgd_bf16_master, KindBf16Master)
TORCHAMP_SGD_LOOP(sgd_f16_master, KindF16Master)
#undef TORCHAMP_SGD_LOOP

using SgdLoop = void (*)(const SgdJob&, int64_t, int64_t, float);

SgdLoop sgd_loop_for(const SgdJob& j, bool unscale) {
  static const SgdLoop kLoops[6][2] = {
      {sgd_f32, sgd_f32_unscale},
      {sgd_f64, sgd_f64_unscale},
      {sgd_bf16, sgd_bf16_unscale},
      {sgd_f16, sgd_f16_unscale},
      {sgd_bf16_master, sgd_bf16_master_unscale},
      {sgd_f16_master, sgd_f16_master_unscale},
  };
  TORCH_INTERNAL_ASSERT(j.master == nullptr || j.dtype == at::kBFloat16 || j.dtype == at::kHalf,
                        "a master weight for a ", j.dtype, " parameter");
  return kLoops[kind_of(j.dtype, j.master)][unscale];
}

// Runs loop_for(job, unscale)(job, begin, end, scale) over every job's
// elements, split as the unscale kernels split theirs.
template <class Job, class LoopFor>
void run_jobs(const std::vector<Job>& jobs, const float* grad_scale, LoopFor loop_for) {
  std::vector<int64_t> offsets(jobs.size() + 1, 0);
  for (size_t k = 0; k < jobs.size(); ++k) {
    TORCH_INTERNAL_ASSERT(jobs[k].numel >= 0 && optim_supports(jobs[k].dtype));
    offsets[k + 1] = offsets[k] + jobs[k].numel;
  }
  const float scale = grad_scale != nullptr ? *grad_scale : 1.0f;
  for_each_piece(offsets, [&](size_t k, int64_t begin, int64_t end) {
    loop_for(jobs[k], grad_scale != nullptr)(jobs[k], begin, end, scale);
  });
}

}  // namespace

bool optim_supports(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
         dtype == at::kHalf;
}

void adam_step_cpu(const std::vector<AdamJob>& jobs, const float* grad_scale) {
  run_jobs(jobs, grad_scale, adam_loop_for);
}

void sgd_step_cpu(const std::vector<SgdJob>& jobs, const float* grad_scale) {
  run_jobs(jobs, grad_scale, sgd_loop_for);
}

}  // namespace kernels
}  // namespace torchamp
