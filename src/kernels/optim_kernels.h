#pragma once

// Internal interface of the fused optimizer kernels (not installed).
//
// One pass over each parameter's data per step, many parameters per call,
// split across ATen's intra-op threads: the gradient is read once (with a
// `grad_scale`, divided by it and written back divided, as ATen's fused ops
// do), the parameter and the state are read and written once. float32 and float64 compute in their
// own type; bfloat16 and float16 in float32, each stored tensor rounded once (round to nearest
// even, as c10::BFloat16 and c10::Half).
//
// Master weights (`master` set, bfloat16 and float16 parameters only): the state is float32, the
// update runs against the float32 master, and the parameter is written as the master rounded. A
// bfloat16 parameter's master is the parameter's 16 bits and an int16 remainder (`master`:
// numel int16), a float16 parameter's a float32 copy (`master`: numel float32).
//
// Stochastic rounding (`stochastic`, bfloat16 parameters without a master only): the update runs
// in float32 as above, and the parameter and its bfloat16 state (float32 with `float_state`,
// stored as it is) are each written back rounded stochastically (float_to_bf16_stochastic), the
// noise of element i a hash of i and the job's `noise_key` (rounding_key): the same key gives the
// same bits, on any thread split or rank.

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace torchamp {
namespace kernels {

/// One parameter of an Adam or AdamW step: every pointer is to `numel`
/// contiguous elements of `dtype`. The scalars are the base class's, in
/// double; the kernel rounds them to the compute type as ATen's ops do.
struct AdamJob {
  void* param;
  void* master = nullptr;  // see the top of this file
  void* grad;              // written back only when unscaled
  void* exp_avg;
  void* exp_avg_sq;
  void* max_exp_avg_sq;  // null unless amsgrad
  int64_t numel;
  at::ScalarType dtype;
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  double step_size;              // lr / (1 - beta1^step)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  bool decoupled;                // AdamW: p *= 1 - lr * weight_decay; Adam: g += weight_decay * p
  bool stochastic = false;       // see the top of this file
  bool float_state = false;      // stochastic: the state is float32, stored exactly
  uint64_t noise_key = 0;
};

/// One parameter of an SGD step. `momentum_buffer` is null when momentum is
/// 0; with `first` it is written (the base class's clone of the first
/// direction) rather than read.
struct SgdJob {
  void* param;
  void* master = nullptr;  // see the top of this file
  void* grad;              // written back only when unscaled
  void* momentum_buffer;
  int64_t numel;
  at::ScalarType dtype;
  double lr;
  double momentum;
  double dampening;
  double weight_decay;
  bool nesterov;
  bool first;
  bool stochastic = false;   // see the top of this file
  bool float_state = false;  // stochastic: the buffer is float32, stored exactly
  uint64_t noise_key = 0;
};

/// The stochastic rounding noise's key for one parameter's update: a hash of
/// the optimizer's seed, its count of rounded updates and the parameter's
/// index in param-group order.
uint64_t rounding_key(uint64_t seed, uint64_t update, uint64_t index);

/// rounding_key's mixing function, splitmix64's finaliser: x += kAdd; then
/// x = (x ^ (x >> kShift[0])) * kMul[0], (x ^ (x >> kShift[1])) * kMul[1],
/// x ^ (x >> kShift[2]) (unsigned). Named for the ATen path's copy
/// (src/optim/aten_rounding.cpp).
struct Mix64 {
  static constexpr uint64_t kAdd = 0x9e3779b97f4a7c15ull;
  static constexpr uint64_t kMul[2] = {0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull};
  static constexpr int kShift[3] = {30, 27, 31};
};

/// True for the dtypes the fused kernels take: float32, float64, bfloat16, float16.
bool optim_supports(at::ScalarType dtype);

/// One step of every job. `grad_scale` (ATen's `grad_scale`): null, or the
/// loss scale the gradients carry, divided out and written back.
void adam_step_cpu(const std::vector<AdamJob>& jobs, const float* grad_scale);
void sgd_step_cpu(const std::vector<SgdJob>& jobs, const float* grad_scale);

}  // namespace kernels
}  // namespace torchamp
