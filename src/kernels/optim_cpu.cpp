// Fused optimizer kernels: the arithmetic of LibTorch's C++ SGD, Adam and
// AdamW steps (torch/csrc/api/src/optim/{sgd,adam,adamw}.cpp), element by
// element in one loop per parameter instead of a chain of ATen operations,
// with the loss scale's division folded into the gradient read (and the
// unscaled gradient written back in the same pass, as ATen's fused ops). Built with
// -O3 -fno-math-errno (so that sqrt vectorises) and -ffp-contract=off (no
// FMA: every path rounds as the one-pass loop), cloned for AVX2 like the
// unscale loops; master weights and stochastic rounding also run in AVX2 + F16C or AVX-512 vectors,
// picked at run time (vector_isa(), below).

#include "optim_kernels.h"

#include "bf16.h"
#include "kernels.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "x86_vec.h"
#ifdef TORCHAMP_X86_VECTORS
#define TORCHAMP_X86_F16C 1
#endif

namespace torchamp {
namespace kernels {
namespace {

// Element storage: load() widens to the compute type M, store() rounds once
// (`noise`: 16 random bits, read by stochastic rounding only).
template <class S>
struct Io {
  using T = S;
  using M = S;
  static M load(const S* p, int64_t i) { return p[i]; }
  static void store(S* p, int64_t i, M v, uint32_t /*noise*/ = 0) { p[i] = v; }
};
struct Bf16 {  // bfloat16 bits, rounded to nearest even (c10::BFloat16)
  using T = uint16_t;
  using M = float;
  static float load(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(uint16_t* p, int64_t i, float v, uint32_t /*noise*/ = 0) {
    p[i] = float_to_bf16(v);
  }
};
struct Bf16Sr {  // bfloat16 bits, rounded stochastically
  using T = uint16_t;
  using M = float;
  static float load(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(uint16_t* p, int64_t i, float v, uint32_t noise) {
    p[i] = float_to_bf16_stochastic(v, noise);
  }
};
struct F16 {  // float16 bits, converted exactly as c10::Half
  using T = uint16_t;
  using M = float;
  static float load(const uint16_t* p, int64_t i) { return f16_to_float(p[i]); }
  static void store(uint16_t* p, int64_t i, float v, uint32_t /*noise*/ = 0) {
    p[i] = float_to_f16(v);
  }
};

// How the update reads and writes a parameter's value (in M).
template <class E>
struct PlainParam {  // the parameter is the value
  using M = typename E::M;
  typename E::T* __restrict p;
  explicit PlainParam(const void* param, const void* /*master*/)
      : p(static_cast<typename E::T*>(const_cast<void*>(param))) {}
  M load(int64_t i) const { return E::load(p, i); }
  void store(int64_t i, M v, uint32_t noise = 0) { E::store(p, i, v, noise); }
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
  void store(int64_t i, float v, uint32_t /*noise*/ = 0) {
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
  void store(int64_t i, float v, uint32_t /*noise*/ = 0) {
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
// gradient's storage; S, the state's; whether its stores round stochastically.
template <class P_, class G_, class S_, bool kStochastic_ = false>
struct Kind {
  using P = P_;
  using G = G_;
  using S = S_;
  static constexpr bool kStochastic = kStochastic_;
};
using KindF32 = Kind<PlainParam<Io<float>>, Io<float>, Io<float>>;
using KindF64 = Kind<PlainParam<Io<double>>, Io<double>, Io<double>>;
using KindBf16 = Kind<PlainParam<Bf16>, Bf16, Bf16>;
using KindF16 = Kind<PlainParam<F16>, F16, F16>;
using KindBf16Master = Kind<Bf16Master, Bf16, Io<float>>;
using KindF16Master = Kind<F16Master, F16, Io<float>>;
// The gradient written back (unscaled) rounds to nearest even, as ATen's.
using KindBf16Stochastic = Kind<PlainParam<Bf16Sr>, Bf16, Bf16Sr, true>;
using KindBf16StochasticF32 = Kind<PlainParam<Bf16Sr>, Bf16, Io<float>, true>;  // float_state

// Element i's noise for each stored tensor of a stochastic job (16 bits
// each: p, the parameter; s0 and s1, the state's first two tensors; AMSGrad's
// max takes s1, the noise of the value it is the max of, so that with the
// same noise the rounded max is never below the rounded value): hashes of i
// and the job's key, computed where the loop needs them (none for other kinds).
struct NoiseBits {
  uint32_t p = 0, s0 = 0, s1 = 0;
};
template <bool kStochastic>
struct Noise {
  explicit Noise(uint64_t /*key*/) {}
  NoiseBits at(int64_t /*i*/) const { return {}; }
};
template <>
struct Noise<true> {
  uint32_t k0, k1;
  explicit Noise(uint64_t key)
      : k0(static_cast<uint32_t>(key)), k1(static_cast<uint32_t>(key >> 32)) {}
  NoiseBits at(int64_t i) const {
    const uint32_t a = noise32(static_cast<uint32_t>(i), k0);
    const uint32_t b = noise32(static_cast<uint32_t>(i), k1);
    return {a & 0xffffu, a >> 16, b & 0xffffu};
  }
};

// The arithmetic of one Adam element, written once: the one-pass loops run
// it on scalars, the vector loops below on 8 or 16 floats (V8, V16), the same
// operations in the same order, so the same bits. In scope: the constants of
// adam_loop (beta1, ..., has_wd, kDecoupled, kAmsgrad); gi, pi, mi, vi and
// vmax (amsgrad) hold the loaded values and leave with the new ones.
#define TORCHAMP_ADAM_ELEMENT(gi, pi, mi, vi, vmax)                                         \
  do {                                                                                      \
    if (has_wd) {                                                                           \
      if (kDecoupled) {                                                                     \
        pi = pi * decay; /* param.mul_(1 - lr * weight_decay) */                            \
      } else {                                                                              \
        gi = gi + wd * pi; /* grad.add(param, weight_decay) */                              \
      }                                                                                     \
    }                                                                                       \
    mi = mi * beta1 + one_minus_beta1 * gi;                                                 \
    vi = vi * beta2 + one_minus_beta2 * gi * gi;                                            \
    auto vd_ = vi;                                                                          \
    if (kAmsgrad) {                                                                         \
      vd_ = maximum(vmax, vi); /* max_out(max_exp_avg_sq, exp_avg_sq, ...) */               \
      vmax = vd_;                                                                           \
    }                                                                                       \
    const auto denom_ = sqrt_of(vd_) / bc2_sqrt + eps;                                      \
    pi = pi + neg_step_size * mi / denom_; /* param.addcdiv_(exp_avg, denom, -step_size) */ \
  } while (false)

// The constants TORCHAMP_ADAM_ELEMENT reads, from AdamJob j and the float
// grad_scale in scope, each rounded to the compute type once as ATen rounds
// its Scalars (MAKE: double -> T; for V8 and V16, to float and broadcast).
#define TORCHAMP_ADAM_CONSTANTS(T, MAKE)                               \
  const T scale = MAKE(grad_scale);                                    \
  const T beta1 = MAKE(j.beta1), one_minus_beta1 = MAKE(1 - j.beta1);  \
  const T beta2 = MAKE(j.beta2), one_minus_beta2 = MAKE(1 - j.beta2);  \
  const T eps = MAKE(j.eps), bc2_sqrt = MAKE(j.bias_correction2_sqrt); \
  const T neg_step_size = MAKE(-j.step_size);                          \
  const T wd = MAKE(j.weight_decay);                                   \
  const T decay = MAKE(1 - j.lr * j.weight_decay);                     \
  const bool has_wd = j.weight_decay != 0

// std::max and std::sqrt, overloaded below for V8 and V16.
template <class M>
inline M maximum(M a, M b) {
  return (a < b) ? b : a;
}
template <class M>
inline M sqrt_of(M a) {
  return std::sqrt(a);
}

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
  const auto to_m = [](double x) { return static_cast<M>(x); };
  TORCHAMP_ADAM_CONSTANTS(M, to_m);
  const Noise<K::kStochastic> noise(j.noise_key);
  for (int64_t i = b; i < e; ++i) {
    M gi = read_grad<G, kUnscale>(g, i, scale);
    M pi = p.load(i);
    M mi = S::load(m, i);
    M vi = S::load(v, i);
    M vmi = kAmsgrad ? S::load(vmax, i) : M{};
    TORCHAMP_ADAM_ELEMENT(gi, pi, mi, vi, vmi);
    // Each stored tensor rounded once (16-bit storage); the update used the unrounded values.
    const NoiseBits n = noise.at(i);
    S::store(m, i, mi, n.s0);
    S::store(v, i, vi, n.s1);
    if (kAmsgrad) {
      S::store(vmax, i, vmi, n.s1);
    }
    p.store(i, pi, n.p);
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
TORCHAMP_ADAM_LOOPS(bf16_stochastic, KindBf16Stochastic)
TORCHAMP_ADAM_LOOPS(bf16_stochastic_f32, KindBf16StochasticF32)
#undef TORCHAMP_ADAM_LOOPS
#undef TORCHAMP_ADAM_LOOP

// A job's kind: the first index of the loop tables below.
template <class Job>
int kind_of(const Job& j) {
  TORCH_INTERNAL_ASSERT(j.master == nullptr || j.dtype == at::kBFloat16 || j.dtype == at::kHalf,
                        "a master weight for a ", j.dtype, " parameter");
  TORCH_INTERNAL_ASSERT(!j.stochastic || (j.dtype == at::kBFloat16 && j.master == nullptr),
                        "stochastic rounding of a ", j.dtype, " parameter",
                        j.master != nullptr ? " with a master weight" : "");
  TORCH_INTERNAL_ASSERT(j.stochastic || !j.float_state,
                        "float32 state without stochastic rounding");
  const bool master = j.master != nullptr;
  switch (j.dtype) {
    case at::kFloat:
      return 0;
    case at::kDouble:
      return 1;
    case at::kBFloat16:
      return master ? 4 : j.stochastic ? (j.float_state ? 7 : 6) : 2;
    case at::kHalf:
      return master ? 5 : 3;
    default:
      TORCH_INTERNAL_ASSERT(false, "unreachable dtype ", j.dtype);
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
  static const AdamLoop kLoops[8][2][2][2] = {
      TORCHAMP_ADAM_ROW(f32),
      TORCHAMP_ADAM_ROW(f64),
      TORCHAMP_ADAM_ROW(bf16),
      TORCHAMP_ADAM_ROW(f16),
      TORCHAMP_ADAM_ROW(bf16_master),
      TORCHAMP_ADAM_ROW(f16_master),
      TORCHAMP_ADAM_ROW(bf16_stochastic),
      TORCHAMP_ADAM_ROW(bf16_stochastic_f32),
  };
  return kLoops[kind_of(j)][j.decoupled][j.max_exp_avg_sq != nullptr][unscale];
}
#undef TORCHAMP_ADAM_ROW

// TORCHAMP_SGD_ELEMENT's constants, as TORCHAMP_ADAM_CONSTANTS (SgdJob j;
// buf, the momentum buffer's pointer, in scope).
#define TORCHAMP_SGD_CONSTANTS(T, MAKE)                                                    \
  const T scale = MAKE(grad_scale);                                                        \
  const T wd = MAKE(j.weight_decay);                                                       \
  const T momentum = MAKE(j.momentum);                                                     \
  const T one_minus_dampening = MAKE(1 - j.dampening);                                     \
  const T neg_lr = MAKE(-1 * j.lr);                                                        \
  const bool has_wd = j.weight_decay != 0, has_momentum = buf != nullptr, first = j.first, \
             nesterov = j.nesterov

// One SGD element, written once as TORCHAMP_ADAM_ELEMENT: d (the gradient),
// pi and bi (the momentum buffer, when there is one and it is not the first
// step) hold the loaded values and leave with the new ones.
#define TORCHAMP_SGD_ELEMENT(d, pi, bi)                                               \
  do {                                                                                \
    if (has_wd) {                                                                     \
      d = d + wd * pi; /* d_p.add(param, weight_decay) */                             \
    }                                                                                 \
    if (has_momentum) {                                                               \
      /* First step: clone(d_p); then buf.mul_(momentum).add_(d_p, 1 - dampening). */ \
      bi = first ? d : bi * momentum + one_minus_dampening * d;                       \
      d = nesterov ? d + momentum * bi : bi;                                          \
    }                                                                                 \
    pi = pi + neg_lr * d;                                                             \
  } while (false)

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
  const auto to_m = [](double x) { return static_cast<M>(x); };
  TORCHAMP_SGD_CONSTANTS(M, to_m);
  const Noise<K::kStochastic> noise(j.noise_key);
  for (int64_t i = b; i < e; ++i) {
    M d = read_grad<G, kUnscale>(g, i, scale);
    M pi = p.load(i);
    M bi = has_momentum && !first ? S::load(buf, i) : M{};
    TORCHAMP_SGD_ELEMENT(d, pi, bi);
    const NoiseBits n = noise.at(i);
    if (has_momentum) {
      S::store(buf, i, bi, n.s0);
    }
    p.store(i, pi, n.p);
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
TORCHAMP_SGD_LOOP(sgd_bf16_stochastic, KindBf16Stochastic)
TORCHAMP_SGD_LOOP(sgd_bf16_stochastic_f32, KindBf16StochasticF32)
#undef TORCHAMP_SGD_LOOP

using SgdLoop = void (*)(const SgdJob&, int64_t, int64_t, float);

SgdLoop sgd_loop_for(const SgdJob& j, bool unscale) {
  static const SgdLoop kLoops[8][2] = {
      {sgd_f32, sgd_f32_unscale},
      {sgd_f64, sgd_f64_unscale},
      {sgd_bf16, sgd_bf16_unscale},
      {sgd_f16, sgd_f16_unscale},
      {sgd_bf16_master, sgd_bf16_master_unscale},
      {sgd_f16_master, sgd_f16_master_unscale},
      {sgd_bf16_stochastic, sgd_bf16_stochastic_unscale},
      {sgd_bf16_stochastic_f32, sgd_bf16_stochastic_f32_unscale},
  };
  return kLoops[kind_of(j)][unscale];
}

AdamLoop loop_for(const AdamJob& j, bool unscale) {
  return adam_loop_for(j, unscale);
}
SgdLoop loop_for(const SgdJob& j, bool unscale) {
  return sgd_loop_for(j, unscale);
}

// ---- master weights and stochastic rounding in vectors: AVX2 + F16C (8 lanes), AVX-512 (16)
//
// The one-pass master loops convert in integer arithmetic and are
// compute-bound where the compiler cannot keep them in vectors: float16's
// conversions are long (2.4x float32's time on the same bytes), and the
// bfloat16 ones with a written-back gradient (a scaler's step) stopped the
// loop vectorising (0.66-0.73x). Where the CPU has them both master kinds run
// a vector at a time: the one-pass loop's arithmetic (TORCHAMP_ADAM_ELEMENT,
// TORCHAMP_SGD_ELEMENT) on vectors of floats, the same operations in the same
// order, so the same bits (tested against the one-pass loops, which
// TORCHAMP_PORTABLE_KERNELS keeps), with float16 converted by VCVTPH2PS /
// VCVTPS2PH and bfloat16 by shifts. One walk (adam_vec, sgd_vec) over two
// instruction sets (Avx2, Avx512), picked per step by vector_isa(). This file
// is built with -ffp-contract=off: AVX-512 implies FMA, and a contracted
// a * b + c rounds once where the portable loop rounds twice.
#ifdef TORCHAMP_X86_F16C

// The warnings x86_vec.h names are off from here to the loop tables. The walk's
// helpers below take and return vectors without a target of their own:
// always inlined into a function with one, they have no ABI to change
// (-Wpsabi). That holds only while every one of them is TORCHAMP_INLINE (or
// has a target): one that is not inlined would pass a __m256/__m512 between
// functions that disagree on how, and nothing here would warn.
TORCHAMP_X86_DIAGNOSTICS_PUSH

// Large jobs stream four to six arrays at once, more than the hardware
// prefetcher keeps ahead of on one core: every 32 elements the lines
// kStreamAhead elements ahead of each are asked for (one line of a 16-bit
// array, two of a float32 one). On 1 x 64M this took SGD with masters from
// 0.73-0.79x of float32's step to 0.78-0.97x over four runs (bench_optim
// --interleaved, AVX2).
constexpr int64_t kStreamAhead = 2048;   // elements
constexpr int64_t kStreamMin = 1 << 16;  // a job's piece at least this long
inline void ahead16(const void* p, int64_t i) {
  __builtin_prefetch(static_cast<const uint16_t*>(p) + i + kStreamAhead, 1);
}
inline void ahead32(const void* p, int64_t i) {
  const float* f = static_cast<const float*>(p) + i + kStreamAhead;
  __builtin_prefetch(f, 1);
  __builtin_prefetch(f + 16, 1);
}

// The instruction sets (Avx2, Avx512, with their vectors V8, V16, H16) are
// the kernels' x86 vector layer, x86_vec.h.

// A float16 parameter and its float32 master (F16Master, a vector at a time).
template <class I>
struct F16MasterVec {
  using V = typename I::V;
  using H = typename I::H;
  uint16_t* __restrict p;
  float* __restrict m;
  F16MasterVec(const void* param, const void* master)
      : p(static_cast<uint16_t*>(const_cast<void*>(param))),
        m(static_cast<float*>(const_cast<void*>(master))) {}
  static TORCHAMP_INLINE V widen(const H& g) { return I::widen_f16(g); }
  template <class L>
  static TORCHAMP_INLINE void store_grad(uint16_t* g, const V& x, const L& lanes) {
    lanes.storeh(g, I::narrow_f16(x));
  }
  template <class L>
  TORCHAMP_INLINE V load(int64_t i, const L& lanes) const {
    return lanes.loadf(m + i);
  }
  template <class L>
  TORCHAMP_INLINE void store(int64_t i, const V& x, const L& lanes) {
    lanes.storef(m + i, x);
    lanes.storeh(p + i, I::narrow_f16(x));
  }
  void ahead(int64_t i) const {
    ahead16(p, i);
    ahead32(m, i);
  }
};

// A bfloat16 parameter and its remainder (Bf16Master, a vector at a time):
// the master's bits are (param << 16) + remainder; stored, the parameter is
// (bits + 0x8000) >> 16 (the high half, plus one where the low half is
// 0x8000 or more, modulo 2^16 as Bf16Master's uint16_t) and the remainder
// the low half.
template <class I>
struct Bf16MasterVec {
  using V = typename I::V;
  using H = typename I::H;
  uint16_t* __restrict p;
  int16_t* __restrict r;
  Bf16MasterVec(const void* param, const void* remainder)
      : p(static_cast<uint16_t*>(const_cast<void*>(param))),
        r(static_cast<int16_t*>(const_cast<void*>(remainder))) {}
  static TORCHAMP_INLINE V widen(const H& g) { return I::widen_bf16(g); }
  template <class L>
  static TORCHAMP_INLINE void store_grad(uint16_t* g, const V& x, const L& lanes) {
    lanes.storeh(g, I::narrow_bf16(x));
  }
  template <class L>
  TORCHAMP_INLINE V load(int64_t i, const L& lanes) const {
    return I::join_bf16(lanes.loadh(p + i), lanes.loadh(r + i));
  }
  template <class L>
  TORCHAMP_INLINE void store(int64_t i, const V& x, const L& lanes) {
    H hi, lo;
    I::split_bf16(x, hi, lo);
    lanes.storeh(p + i, hi);
    lanes.storeh(r + i, lo);
  }
  void ahead(int64_t i) const {
    ahead16(p, i);
    ahead16(r, i);
  }
};

// read_grad on a vector of 16-bit gradients: divided by the scale and
// written back divided (kUnscale), else as they are.
template <class MV, bool kUnscale, class L>
TORCHAMP_INLINE typename MV::V read_grad_vec(uint16_t* g, const typename MV::V& scale,
                                             const L& lanes) {
  typename MV::V x = MV::widen(lanes.loadh(g));
  if (kUnscale) {
    x = x / scale;
    MV::store_grad(g, x, lanes);
  }
  return x;
}

// Walks a master or stochastic job's [b, e) a vector at a time, `iteration(i, lanes)` on
// each, the tail as the instruction set says, asking for each array's lines
// ahead on long pieces (`ahead(i)`); false (nothing done) where the piece is
// too short for an unmasked set.
template <class I, class Iteration, class Ahead>
TORCHAMP_INLINE bool walk(int64_t b, int64_t e, const Iteration& iteration, const Ahead& ahead) {
  if (!I::kMasked && e - b < I::kWidth) {
    return false;
  }
  const bool stream = e - b >= kStreamMin;
  int64_t i = b;
  for (; i + I::kWidth <= e; i += I::kWidth) {
    if (stream && (i - b) % 32 == 0) {
      ahead(i);
    }
    iteration(i, typename I::All());
  }
  if (i < e) {
    iteration(I::tail_start(i, e), I::tail_lanes(e - i));
  }
  return true;
}

// A master-weight Adam/AdamW job over [b, e): the one-pass loop's arithmetic
// a vector at a time, its constants rounded to float as there.
template <class I, class MV, bool kDecoupled, bool kAmsgrad, bool kUnscale>
TORCHAMP_INLINE void adam_vec(const AdamJob& j, int64_t b, int64_t e, float grad_scale) {
  using V = typename I::V;
  MV p(j.param, j.master);
  auto* __restrict g = static_cast<uint16_t*>(j.grad);
  auto* __restrict m = static_cast<float*>(j.exp_avg);
  auto* __restrict v = static_cast<float*>(j.exp_avg_sq);
  auto* __restrict vmax = static_cast<float*>(j.max_exp_avg_sq);
  TORCHAMP_ADAM_CONSTANTS(V, I::splat);
  const auto iteration = [&](int64_t i, const auto& lanes) __attribute__((always_inline)) {
    V gi = read_grad_vec<MV, kUnscale>(g + i, scale, lanes);
    V pi = p.load(i, lanes), mi = lanes.loadf(m + i), vi = lanes.loadf(v + i);
    V vmi = kAmsgrad ? lanes.loadf(vmax + i) : V{};
    TORCHAMP_ADAM_ELEMENT(gi, pi, mi, vi, vmi);
    lanes.storef(m + i, mi);
    lanes.storef(v + i, vi);
    if (kAmsgrad) {
      lanes.storef(vmax + i, vmi);
    }
    p.store(i, pi, lanes);
  };
  const auto ahead = [&](int64_t i) __attribute__((always_inline)) {
    p.ahead(i);
    ahead16(g, i);
    ahead32(m, i);
    ahead32(v, i);
    if (kAmsgrad) {
      ahead32(vmax, i);
    }
  };
  if (!walk<I>(b, e, iteration, ahead)) {
    adam_loop_for(j, kUnscale)(j, b, e, grad_scale);
  }
}

template <class I, class MV, bool kUnscale>
TORCHAMP_INLINE void sgd_vec(const SgdJob& j, int64_t b, int64_t e, float grad_scale) {
  using V = typename I::V;
  MV p(j.param, j.master);
  auto* __restrict g = static_cast<uint16_t*>(j.grad);
  auto* __restrict buf = static_cast<float*>(j.momentum_buffer);
  TORCHAMP_SGD_CONSTANTS(V, I::splat);
  const auto iteration = [&](int64_t i, const auto& lanes) __attribute__((always_inline)) {
    V d = read_grad_vec<MV, kUnscale>(g + i, scale, lanes);
    V pi = p.load(i, lanes);
    V bi = has_momentum && !first ? lanes.loadf(buf + i) : V{};
    TORCHAMP_SGD_ELEMENT(d, pi, bi);
    if (has_momentum) {
      lanes.storef(buf + i, bi);
    }
    p.store(i, pi, lanes);
  };
  const auto ahead = [&](int64_t i) __attribute__((always_inline)) {
    p.ahead(i);
    ahead16(g, i);
    if (has_momentum) {
      ahead32(buf, i);
    }
  };
  if (!walk<I>(b, e, iteration, ahead)) {
    sgd_loop_for(j, kUnscale)(j, b, e, grad_scale);
  }
}

// Noise<true> a vector at a time: the same hashes of the same element
// indices, so the same bits as the one-pass loop.
template <class I>
struct NoiseVec {
  using N = typename I::N;
  N p, s0, s1;
  TORCHAMP_INLINE NoiseVec(uint64_t key, int64_t i) {
    const auto k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    const N lanes = I::lanes_from(i);
    const N a = I::noise32(lanes, k0);
    const N b = I::noise32(lanes, k1);
    p = I::low16(a);
    s0 = I::high16(a);
    s1 = I::low16(b);
  }
};

// A stochastic job's state a vector at a time: bfloat16, rounded
// stochastically (Bf16Sr), or float32 stored exactly (float_state, Io<float>).
template <class I>
struct Bf16SrState {
  using V = typename I::V;
  using N = typename I::N;
  using T = uint16_t;
  template <class L>
  static TORCHAMP_INLINE V load(const T* s, const L& lanes) {
    return I::widen_bf16(lanes.loadh(s));
  }
  template <class L>
  static TORCHAMP_INLINE void store(T* s, const V& x, const N& noise, const L& lanes) {
    lanes.storeh(s, I::narrow_bf16_stochastic(x, noise));
  }
  static void ahead(const T* s, int64_t i) { ahead16(s, i); }
};
template <class I>
struct F32State {
  using V = typename I::V;
  using N = typename I::N;
  using T = float;
  template <class L>
  static TORCHAMP_INLINE V load(const T* s, const L& lanes) {
    return lanes.loadf(s);
  }
  template <class L>
  static TORCHAMP_INLINE void store(T* s, const V& x, const N& /*noise*/, const L& lanes) {
    lanes.storef(s, x);
  }
  static void ahead(const T* s, int64_t i) { ahead32(s, i); }
};

// A stochastic-rounding job (bfloat16 parameter and gradient, state as SV)
// over [b, e): the one-pass loop's arithmetic a vector at a time, as adam_vec.
template <class I, class SV, bool kDecoupled, bool kAmsgrad, bool kUnscale>
TORCHAMP_INLINE void adam_sr_vec(const AdamJob& j, int64_t b, int64_t e, float grad_scale) {
  using V = typename I::V;
  using S = typename SV::T;
  using MV = Bf16MasterVec<I>;  // for its bfloat16 gradient read (read_grad_vec)
  auto* __restrict p = static_cast<uint16_t*>(j.param);
  auto* __restrict g = static_cast<uint16_t*>(j.grad);
  auto* __restrict m = static_cast<S*>(j.exp_avg);
  auto* __restrict v = static_cast<S*>(j.exp_avg_sq);
  auto* __restrict vmax = static_cast<S*>(j.max_exp_avg_sq);
  TORCHAMP_ADAM_CONSTANTS(V, I::splat);
  const auto iteration = [&](int64_t i, const auto& lanes) __attribute__((always_inline)) {
    V gi = read_grad_vec<MV, kUnscale>(g + i, scale, lanes);
    V pi = I::widen_bf16(lanes.loadh(p + i)), mi = SV::load(m + i, lanes);
    V vi = SV::load(v + i, lanes);
    V vmi = kAmsgrad ? SV::load(vmax + i, lanes) : V{};
    TORCHAMP_ADAM_ELEMENT(gi, pi, mi, vi, vmi);
    const NoiseVec<I> n(j.noise_key, i);
    SV::store(m + i, mi, n.s0, lanes);
    SV::store(v + i, vi, n.s1, lanes);
    if (kAmsgrad) {
      SV::store(vmax + i, vmi, n.s1, lanes);
    }
    lanes.storeh(p + i, I::narrow_bf16_stochastic(pi, n.p));
  };
  const auto ahead = [&](int64_t i) __attribute__((always_inline)) {
    ahead16(p, i);
    ahead16(g, i);
    SV::ahead(m, i);
    SV::ahead(v, i);
    if (kAmsgrad) {
      SV::ahead(vmax, i);
    }
  };
  if (!walk<I>(b, e, iteration, ahead)) {
    adam_loop_for(j, kUnscale)(j, b, e, grad_scale);
  }
}

template <class I, class SV, bool kUnscale>
TORCHAMP_INLINE void sgd_sr_vec(const SgdJob& j, int64_t b, int64_t e, float grad_scale) {
  using V = typename I::V;
  using MV = Bf16MasterVec<I>;
  auto* __restrict p = static_cast<uint16_t*>(j.param);
  auto* __restrict g = static_cast<uint16_t*>(j.grad);
  auto* __restrict buf = static_cast<typename SV::T*>(j.momentum_buffer);
  TORCHAMP_SGD_CONSTANTS(V, I::splat);
  const auto iteration = [&](int64_t i, const auto& lanes) __attribute__((always_inline)) {
    V d = read_grad_vec<MV, kUnscale>(g + i, scale, lanes);
    V pi = I::widen_bf16(lanes.loadh(p + i));
    V bi = has_momentum && !first ? SV::load(buf + i, lanes) : V{};
    TORCHAMP_SGD_ELEMENT(d, pi, bi);
    const NoiseVec<I> n(j.noise_key, i);
    if (has_momentum) {
      SV::store(buf + i, bi, n.s0, lanes);
    }
    lanes.storeh(p + i, I::narrow_bf16_stochastic(pi, n.p));
  };
  const auto ahead = [&](int64_t i) __attribute__((always_inline)) {
    ahead16(p, i);
    ahead16(g, i);
    if (has_momentum) {
      SV::ahead(buf, i);
    }
  };
  if (!walk<I>(b, e, iteration, ahead)) {
    sgd_loop_for(j, kUnscale)(j, b, e, grad_scale);
  }
}

// The walks compiled for each instruction set (the walk above is inlined
// into a function with that target).
template <class MV, bool kDecoupled, bool kAmsgrad, bool kUnscale>
TORCHAMP_AVX2 void adam_avx2(const AdamJob& j, int64_t b, int64_t e, float s) {
  adam_vec<Avx2, MV, kDecoupled, kAmsgrad, kUnscale>(j, b, e, s);
}
template <class MV, bool kDecoupled, bool kAmsgrad, bool kUnscale>
TORCHAMP_AVX512 void adam_avx512(const AdamJob& j, int64_t b, int64_t e, float s) {
  adam_vec<Avx512, MV, kDecoupled, kAmsgrad, kUnscale>(j, b, e, s);
}
template <class MV, bool kUnscale>
TORCHAMP_AVX2 void sgd_avx2(const SgdJob& j, int64_t b, int64_t e, float s) {
  sgd_vec<Avx2, MV, kUnscale>(j, b, e, s);
}
template <class MV, bool kUnscale>
TORCHAMP_AVX512 void sgd_avx512(const SgdJob& j, int64_t b, int64_t e, float s) {
  sgd_vec<Avx512, MV, kUnscale>(j, b, e, s);
}
template <template <class> class SV, bool kDecoupled, bool kAmsgrad, bool kUnscale>
TORCHAMP_AVX2 void adam_sr_avx2(const AdamJob& j, int64_t b, int64_t e, float s) {
  adam_sr_vec<Avx2, SV<Avx2>, kDecoupled, kAmsgrad, kUnscale>(j, b, e, s);
}
template <template <class> class SV, bool kDecoupled, bool kAmsgrad, bool kUnscale>
TORCHAMP_AVX512 void adam_sr_avx512(const AdamJob& j, int64_t b, int64_t e, float s) {
  adam_sr_vec<Avx512, SV<Avx512>, kDecoupled, kAmsgrad, kUnscale>(j, b, e, s);
}
template <template <class> class SV, bool kUnscale>
TORCHAMP_AVX2 void sgd_sr_avx2(const SgdJob& j, int64_t b, int64_t e, float s) {
  sgd_sr_vec<Avx2, SV<Avx2>, kUnscale>(j, b, e, s);
}
template <template <class> class SV, bool kUnscale>
TORCHAMP_AVX512 void sgd_sr_avx512(const SgdJob& j, int64_t b, int64_t e, float s) {
  sgd_sr_vec<Avx512, SV<Avx512>, kUnscale>(j, b, e, s);
}
TORCHAMP_X86_DIAGNOSTICS_POP

#define TORCHAMP_ADAM_VEC_ROW(F, MV)                            \
  {                                                             \
    {{F<MV, false, false, false>, F<MV, false, false, true>},   \
     {F<MV, false, true, false>, F<MV, false, true, true>}},    \
        {{F<MV, true, false, false>, F<MV, true, false, true>}, \
         {F<MV, true, true, false>, F<MV, true, true, true>}},  \
  }
#define TORCHAMP_ADAM_VEC_ISA(F, I) \
  { TORCHAMP_ADAM_VEC_ROW(F, Bf16MasterVec<I>), TORCHAMP_ADAM_VEC_ROW(F, F16MasterVec<I>) }
#define TORCHAMP_SGD_VEC_ISA(F, I)                             \
  {                                                            \
    {F<Bf16MasterVec<I>, false>, F<Bf16MasterVec<I>, true>}, { \
      F<F16MasterVec<I>, false>, F<F16MasterVec<I>, true>      \
    }                                                          \
  }

// The loop for a master (or stochastic) job on `isa` (avx2 or avx512):
// [avx512][float16][decoupled][amsgrad][unscale].
// A stochastic job's: [avx512][float_state][decoupled][amsgrad][unscale].
#define TORCHAMP_ADAM_SR_ROW(F, SV)                             \
  {                                                             \
    {{F<SV, false, false, false>, F<SV, false, false, true>},   \
     {F<SV, false, true, false>, F<SV, false, true, true>}},    \
        {{F<SV, true, false, false>, F<SV, true, false, true>}, \
         {F<SV, true, true, false>, F<SV, true, true, true>}},  \
  }
#define TORCHAMP_ADAM_SR_ISA(F) \
  { TORCHAMP_ADAM_SR_ROW(F, Bf16SrState), TORCHAMP_ADAM_SR_ROW(F, F32State) }
AdamLoop vec_loop_for(Isa isa, const AdamJob& j, bool unscale) {
  static const AdamLoop kSrLoops[2][2][2][2][2] = {TORCHAMP_ADAM_SR_ISA(adam_sr_avx2),
                                                   TORCHAMP_ADAM_SR_ISA(adam_sr_avx512)};
  if (j.stochastic) {
    return kSrLoops[isa == Isa::avx512][j.float_state][j.decoupled][j.max_exp_avg_sq != nullptr]
                   [unscale];
  }
  static const AdamLoop kLoops[2][2][2][2][2] = {TORCHAMP_ADAM_VEC_ISA(adam_avx2, Avx2),
                                                 TORCHAMP_ADAM_VEC_ISA(adam_avx512, Avx512)};
  return kLoops[isa == Isa::avx512][j.dtype == at::kHalf][j.decoupled][j.max_exp_avg_sq != nullptr]
               [unscale];
}
SgdLoop vec_loop_for(Isa isa, const SgdJob& j, bool unscale) {
  static const SgdLoop kSrLoops[2][2][2] = {
      {{sgd_sr_avx2<Bf16SrState, false>, sgd_sr_avx2<Bf16SrState, true>},
       {sgd_sr_avx2<F32State, false>, sgd_sr_avx2<F32State, true>}},
      {{sgd_sr_avx512<Bf16SrState, false>, sgd_sr_avx512<Bf16SrState, true>},
       {sgd_sr_avx512<F32State, false>, sgd_sr_avx512<F32State, true>}}};
  if (j.stochastic) {
    return kSrLoops[isa == Isa::avx512][j.float_state][unscale];
  }
  static const SgdLoop kLoops[2][2][2] = {TORCHAMP_SGD_VEC_ISA(sgd_avx2, Avx2),
                                          TORCHAMP_SGD_VEC_ISA(sgd_avx512, Avx512)};
  return kLoops[isa == Isa::avx512][j.dtype == at::kHalf][unscale];
}
#undef TORCHAMP_SGD_VEC_ISA
#undef TORCHAMP_ADAM_SR_ISA
#undef TORCHAMP_ADAM_SR_ROW
#undef TORCHAMP_ADAM_VEC_ISA
#undef TORCHAMP_ADAM_VEC_ROW
#else
template <class Job>
auto vec_loop_for(Isa /*isa*/, const Job& j, bool unscale) {
  return loop_for(j, unscale);
}
#endif

// A job's elements [b, e): master weights and stochastic rounding a vector
// at a time where the CPU has AVX2 and F16C or AVX-512 (`isa`, vector_isa()
// of the step), everything else one-pass.
template <class Job>
void run_job(Isa isa, const Job& j, bool unscale, int64_t b, int64_t e, float s) {
  const bool vec = isa != Isa::portable && (j.master != nullptr || j.stochastic);
  (vec ? vec_loop_for(isa, j, unscale) : loop_for(j, unscale))(j, b, e, s);
}

// Many small parameters: each array of each one starts with a cache miss
// (separate allocations, no stream for the hardware prefetcher to follow),
// and a master adds an array. Up to kPrefetchBytes of every array of the job
// kPrefetchJobs ahead are asked for while this one runs.
constexpr size_t kPrefetchJobs = 4;
constexpr int64_t kPrefetchBytes = 1024;

void prefetch_array(const void* p, int64_t bytes) {
  if (p == nullptr) {
    return;
  }
  const auto* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < std::min(bytes, kPrefetchBytes); o += 64) {
    __builtin_prefetch(c + o, 1);
  }
}

int64_t element_bytes(at::ScalarType dtype) {
  return dtype == at::kDouble ? 8 : dtype == at::kFloat ? 4 : 2;
}

// A state element's bytes: float32 with a master or float_state, else the
// parameter's dtype.
template <class Job>
int64_t state_bytes(const Job& j) {
  return j.master != nullptr || j.float_state ? 4 : element_bytes(j.dtype);
}

void prefetch_small(const AdamJob& j) {
  const int64_t e = element_bytes(j.dtype) * j.numel;
  const int64_t st = state_bytes(j) * j.numel;
  prefetch_array(j.param, e);
  prefetch_array(j.grad, e);
  prefetch_array(j.master, j.dtype == at::kHalf ? 4 * j.numel : e);
  prefetch_array(j.exp_avg, st);
  prefetch_array(j.exp_avg_sq, st);
  prefetch_array(j.max_exp_avg_sq, st);
}

void prefetch_small(const SgdJob& j) {
  const int64_t e = element_bytes(j.dtype) * j.numel;
  prefetch_array(j.param, e);
  prefetch_array(j.grad, e);
  prefetch_array(j.master, j.dtype == at::kHalf ? 4 * j.numel : e);
  prefetch_array(j.momentum_buffer, state_bytes(j) * j.numel);
}

// Runs run_job(isa, job, unscale, begin, end, scale) over every job's
// elements, split as the unscale kernels split theirs.
template <class Job, class Run>
void run_jobs(const std::vector<Job>& jobs, const float* grad_scale, Run run) {
  std::vector<int64_t> offsets(jobs.size() + 1, 0);
  for (size_t k = 0; k < jobs.size(); ++k) {
    TORCH_INTERNAL_ASSERT(jobs[k].numel >= 0 && optim_supports(jobs[k].dtype));
    offsets[k + 1] = offsets[k] + jobs[k].numel;
  }
  const float scale = grad_scale != nullptr ? *grad_scale : 1.0f;
  const Isa isa = vector_isa();
  for_each_piece(offsets, [&](size_t k, int64_t begin, int64_t end) {
    if (k + kPrefetchJobs < jobs.size()) {
      prefetch_small(jobs[k + kPrefetchJobs]);
    }
    run(isa, jobs[k], grad_scale != nullptr, begin, end, scale);
  });
}

}  // namespace

uint64_t rounding_key(uint64_t seed, uint64_t update, uint64_t index) {
  // splitmix64's finaliser, chained.
  const auto mix64 = [](uint64_t x) {
    x += Mix64::kAdd;
    x = (x ^ (x >> Mix64::kShift[0])) * Mix64::kMul[0];
    x = (x ^ (x >> Mix64::kShift[1])) * Mix64::kMul[1];
    return x ^ (x >> Mix64::kShift[2]);
  };
  return mix64(mix64(seed ^ mix64(update)) + index);
}

bool optim_supports(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
         dtype == at::kHalf;
}

void adam_step_cpu(const std::vector<AdamJob>& jobs, const float* grad_scale) {
  run_jobs(jobs, grad_scale, run_job<AdamJob>);
}

void sgd_step_cpu(const std::vector<SgdJob>& jobs, const float* grad_scale) {
  run_jobs(jobs, grad_scale, run_job<SgdJob>);
}

}  // namespace kernels
}  // namespace torchamp
