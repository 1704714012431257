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

// Storage type S, compute type M.
template <class S>
struct Io {
  using M = S;
  static M load(const S* p, int64_t i) { return p[i]; }
  static void store(S* p, int64_t i, M v) { p[i] = v; }
};
template <>
struct Io<uint16_t> {  // bfloat16 bits
  using M = float;
  static float load(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(uint16_t* p, int64_t i, float v) { p[i] = float_to_bf16(v); }
};

// The gradient as the update reads it: divided by the loss scale and written
// back divided (kUnscale, as ATen's fused ops with a grad_scale), else as is.
template <class S, bool kUnscale>
__attribute__((always_inline)) inline typename Io<S>::M read_grad(S* __restrict g, int64_t i,
                                                                  typename Io<S>::M scale) {
  auto gi = Io<S>::load(g, i);
  if (kUnscale) {
    gi = gi / scale;
    Io<S>::store(g, i, gi);
  }
  return gi;
}

template <class S, bool kDecoupled, bool kAmsgrad, bool kUnscale>
__attribute__((always_inline)) inline void adam_loop(const AdamJob& j, int64_t b, int64_t e,
                                                     float grad_scale) {
  using M = typename Io<S>::M;
  S* __restrict p = static_cast<S*>(j.param);
  S* __restrict g = static_cast<S*>(j.grad);
  S* __restrict m = static_cast<S*>(j.exp_avg);
  S* __restrict v = static_cast<S*>(j.exp_avg_sq);
  S* __restrict vmax = static_cast<S*>(j.max_exp_avg_sq);
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
    M gi = read_grad<S, kUnscale>(g, i, scale);
    M pi = Io<S>::load(p, i);
    if (has_wd) {
      if (kDecoupled) {
        pi = pi * decay;  // param.mul_(1 - lr * weight_decay)
      } else {
        gi = gi + wd * pi;  // grad.add(param, weight_decay)
      }
    }
    const M mi = Io<S>::load(m, i) * beta1 + one_minus_beta1 * gi;
    const M vi = Io<S>::load(v, i) * beta2 + one_minus_beta2 * gi * gi;
    M vd = vi;
    if (kAmsgrad) {
      vd = std::max(Io<S>::load(vmax, i), vi);  // max_out(max_exp_avg_sq, exp_avg_sq, ...)
      Io<S>::store(vmax, i, vd);
    }
    const M denom = std::sqrt(vd) / bc2_sqrt + eps;
    pi = pi + neg_step_size * mi / denom;  // param.addcdiv_(exp_avg, denom, -step_size)
    // Each stored tensor rounded once (bfloat16); the update used the unrounded values.
    Io<S>::store(m, i, mi);
    Io<S>::store(v, i, vi);
    Io<S>::store(p, i, pi);
  }
}

// The clones: target_clones does not apply to templates, so one plain
// function per instantiation; NAME(j, b, e, scale) with or without the unscale.
#define TORCHAMP_ADAM_LOOP(NAME, S, DECOUPLED, AMSGRAD)                                         \
  TORCHAMP_TARGET_CLONES void NAME(const AdamJob& j, int64_t b, int64_t e, float s) {           \
    adam_loop<S, DECOUPLED, AMSGRAD, false>(j, b, e, s);                                        \
  }                                                                                             \
  TORCHAMP_TARGET_CLONES void NAME##_unscale(const AdamJob& j, int64_t b, int64_t e, float s) { \
    adam_loop<S, DECOUPLED, AMSGRAD, true>(j, b, e, s);                                         \
  }
TORCHAMP_ADAM_LOOP(adam_f32, float, false, false)
TORCHAMP_ADAM_LOOP(adam_f32_ams, float, false, true)
TORCHAMP_ADAM_LOOP(adamw_f32, float, true, false)
TORCHAMP_ADAM_LOOP(adamw_f32_ams, float, true, true)
TORCHAMP_ADAM_LOOP(adam_f64, double, false, false)
TORCHAMP_ADAM_LOOP(adam_f64_ams, double, false, true)
TORCHAMP_ADAM_LOOP(adamw_f64, double, true, false)
TORCHAMP_ADAM_LOOP(adamw_f64_ams, double, true, true)
TORCHAMP_ADAM_LOOP(adam_bf16, uint16_t, false, false)
TORCHAMP_ADAM_LOOP(adam_bf16_ams, uint16_t, false, true)
TORCHAMP_ADAM_LOOP(adamw_bf16, uint16_t, true, false)
TORCHAMP_ADAM_LOOP(adamw_bf16_ams, uint16_t, true, true)
#undef TORCHAMP_ADAM_LOOP

using AdamLoop = void (*)(const AdamJob&, int64_t, int64_t, float);

// The loop for a job: [dtype][decoupled][amsgrad][unscale].
AdamLoop adam_loop_for(const AdamJob& j, bool unscale) {
  static const AdamLoop kLoops[3][2][2][2] = {
      {{{adam_f32, adam_f32_unscale}, {adam_f32_ams, adam_f32_ams_unscale}},
       {{adamw_f32, adamw_f32_unscale}, {adamw_f32_ams, adamw_f32_ams_unscale}}},
      {{{adam_f64, adam_f64_unscale}, {adam_f64_ams, adam_f64_ams_unscale}},
       {{adamw_f64, adamw_f64_unscale}, {adamw_f64_ams, adamw_f64_ams_unscale}}},
      {{{adam_bf16, adam_bf16_unscale}, {adam_bf16_ams, adam_bf16_ams_unscale}},
       {{adamw_bf16, adamw_bf16_unscale}, {adamw_bf16_ams, adamw_bf16_ams_unscale}}},
  };
  const int d = j.dtype == at::kFloat ? 0 : j.dtype == at::kDouble ? 1 : 2;
  TORCH_INTERNAL_ASSERT(d < 2 || j.dtype == at::kBFloat16, "unreachable dtype ", j.dtype);
  return kLoops[d][j.decoupled][j.max_exp_avg_sq != nullptr][unscale];
}

template <class S, bool kUnscale>
__attribute__((always_inline)) inline void sgd_loop(const SgdJob& j, int64_t b, int64_t e,
                                                    float grad_scale) {
  using M = typename Io<S>::M;
  S* __restrict p = static_cast<S*>(j.param);
  S* __restrict g = static_cast<S*>(j.grad);
  S* __restrict buf = static_cast<S*>(j.momentum_buffer);
  const M scale = static_cast<M>(grad_scale);
  const M wd = static_cast<M>(j.weight_decay);
  const M momentum = static_cast<M>(j.momentum);
  const M one_minus_dampening = static_cast<M>(1 - j.dampening);
  const M neg_lr = static_cast<M>(-1 * j.lr);
  const bool has_wd = j.weight_decay != 0, has_momentum = buf != nullptr, first = j.first,
             nesterov = j.nesterov;
  for (int64_t i = b; i < e; ++i) {
    M d = read_grad<S, kUnscale>(g, i, scale);
    const M pi = Io<S>::load(p, i);
    if (has_wd) {
      d = d + wd * pi;  // d_p.add(param, weight_decay)
    }
    if (has_momentum) {
      // First step: clone(d_p); then buf.mul_(momentum).add_(d_p, 1 - dampening).
      const M bi = first ? d : Io<S>::load(buf, i) * momentum + one_minus_dampening * d;
      Io<S>::store(buf, i, bi);
      d = nesterov ? d + momentum * bi : bi;
    }
    Io<S>::store(p, i, pi + neg_lr * d);
  }
}

#define TORCHAMP_SGD_LOOP(NAME, S)                                                             \
  TORCHAMP_TARGET_CLONES void NAME(const SgdJob& j, int64_t b, int64_t e, float s) {           \
    sgd_loop<S, false>(j, b, e, s);                                                            \
  }                                                                                            \
  TORCHAMP_TARGET_CLONES void NAME##_unscale(const SgdJob& j, int64_t b, int64_t e, float s) { \
    sgd_loop<S, true>(j, b, e, s);                                                             \
  }
TORCHAMP_SGD_LOOP(sgd_f32, float)
TORCHAMP_SGD_LOOP(sgd_f64, double)
TORCHAMP_SGD_LOOP(sgd_bf16, uint16_t)
#undef TORCHAMP_SGD_LOOP

using SgdLoop = void (*)(const SgdJob&, int64_t, int64_t, float);

SgdLoop sgd_loop_for(const SgdJob& j, bool unscale) {
  switch (j.dtype) {
    case at::kFloat:
      return unscale ? sgd_f32_unscale : sgd_f32;
    case at::kDouble:
      return unscale ? sgd_f64_unscale : sgd_f64;
    case at::kBFloat16:
      return unscale ? sgd_bf16_unscale : sgd_bf16;
    default:
      TORCH_INTERNAL_ASSERT(false, "unreachable dtype ", j.dtype);
  }
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
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16;
}

void adam_step_cpu(const std::vector<AdamJob>& jobs, const float* grad_scale) {
  run_jobs(jobs, grad_scale, adam_loop_for);
}

void sgd_step_cpu(const std::vector<SgdJob>& jobs, const float* grad_scale) {
  run_jobs(jobs, grad_scale, sgd_loop_for);
}

}  // namespace kernels
}  // namespace torchamp
