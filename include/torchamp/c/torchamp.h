#ifndef TORCHAMP_C_TORCHAMP_H
#define TORCHAMP_C_TORCHAMP_H

/* torchamp's C ABI (libtorchamp_c, CMake target torchamp::c): the GradScaler
 * (PyTorch's and Paddle's), autocast, the fused optimizers, and process
 * groups + DDP, for bindings of LibTorch in other languages (tch-rs,
 * TorchSharp, JavaCPP). docs/bindings.md has the conventions: handles and
 * who frees them, threads, and the error protocol.
 *
 * Every call that can fail returns a torchamp_status: TORCHAMP_OK, or the
 * type of the error with its message in torchamp_last_error(); the others
 * (the _free and most _default functions) cannot fail. No C++ exception
 * crosses this ABI, and a call that fails changes nothing. Pointers passed in are
 * borrowed for the call; handles returned through an `out` pointer are new
 * and the caller frees them with their _free function. */

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define TORCHAMP_C_API __attribute__((visibility("default")))
#else
#define TORCHAMP_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a function's signature or a struct's layout changes. */
#define TORCHAMP_C_ABI_VERSION 1

/* ---- status codes and errors ---- */

typedef int32_t torchamp_status;
enum {
  TORCHAMP_OK = 0,
  TORCHAMP_RUNTIME_ERROR = 1,         /* c10::Error: misuse (Python's RuntimeError) */
  TORCHAMP_VALUE_ERROR = 2,           /* c10::ValueError: a bad value */
  TORCHAMP_TYPE_ERROR = 3,            /* c10::TypeError, or a NULL where a handle belongs */
  TORCHAMP_NOT_IMPLEMENTED_ERROR = 4, /* c10::NotImplementedError: an unsupported dtype */
  TORCHAMP_OUT_OF_MEMORY = 5          /* std::bad_alloc, c10::OutOfMemoryError (a GPU's) */
};

/* The message of this thread's last failed call ("" before any); valid
 * until this thread's next failed call. */
TORCHAMP_C_API const char* torchamp_last_error(void);
/* The status of this thread's last failed call (TORCHAMP_OK before any). */
TORCHAMP_C_API torchamp_status torchamp_last_status(void);

/* "0.1.0": the library's version. */
TORCHAMP_C_API const char* torchamp_version(void);
/* TORCHAMP_C_ABI_VERSION of the library loaded; compare with the header's. */
TORCHAMP_C_API int32_t torchamp_abi_version(void);

/* ---- tensors ---- */

/* A torchamp_tensor* is an at::Tensor*: the handle tch-rs (C_tensor) and
 * TorchSharp (Tensor.Handle) already hold. Tensors this ABI returns are new
 * at::Tensor objects: free them with torchamp_tensor_free (or the binding's
 * own free, which is `delete` too). */
typedef struct torchamp_tensor torchamp_tensor;
TORCHAMP_C_API void torchamp_tensor_free(torchamp_tensor* tensor);

/* ---- a scaler's state as flat key-value entries ---- */

enum { TORCHAMP_KIND_DOUBLE = 1, TORCHAMP_KIND_INT = 2, TORCHAMP_KIND_BOOL = 3 };

/* One state-dict entry: the key is PyTorch's (or Paddle's) state-dict key;
 * the value is `f` for TORCHAMP_KIND_DOUBLE, `i` for INT and BOOL (0 or 1). */
typedef struct torchamp_entry {
  const char* key;
  int32_t kind;
  int32_t reserved; /* 0 */
  double f;
  int64_t i;
} torchamp_entry;

/* A state dict returned by torchamp_scaler_state_dict; it owns its keys. */
typedef struct torchamp_state torchamp_state;
TORCHAMP_C_API torchamp_status torchamp_state_entries(const torchamp_state* state,
                                                      const torchamp_entry** entries,
                                                      size_t* count);
TORCHAMP_C_API void torchamp_state_free(torchamp_state* state);

/* ---- optimizers: torchamp::optim::SGD, Adam, AdamW ---- */

typedef struct torchamp_optimizer torchamp_optimizer;

/* torch::optim::SGDOptions's fields; master_weights keeps float32 copies of
 * float16/bfloat16 parameters (torchamp::optim::FusedOptions). */
typedef struct torchamp_sgd_options {
  double lr;
  double momentum;
  double dampening;
  double weight_decay;
  int32_t nesterov;
  int32_t master_weights;
} torchamp_sgd_options;

/* torch::optim::AdamOptions's (and AdamWOptions's) fields. */
typedef struct torchamp_adam_options {
  double lr;
  double beta1;
  double beta2;
  double eps;
  double weight_decay;
  int32_t amsgrad;
  int32_t master_weights;
} torchamp_adam_options;

/* PyTorch's defaults: lr 1e-3 (Adam: betas 0.9, 0.999, eps 1e-8; AdamW:
 * weight_decay 1e-2), the rest 0. */
TORCHAMP_C_API void torchamp_sgd_options_default(torchamp_sgd_options* options);
TORCHAMP_C_API void torchamp_adam_options_default(torchamp_adam_options* options);
TORCHAMP_C_API void torchamp_adamw_options_default(torchamp_adam_options* options);

/* An optimizer over `count` parameters (borrowed handles; the optimizer
 * shares their tensors). NULL options: the defaults above. */
TORCHAMP_C_API torchamp_status torchamp_sgd_new(torchamp_tensor* const* params, size_t count,
                                                const torchamp_sgd_options* options,
                                                torchamp_optimizer** out);
TORCHAMP_C_API torchamp_status torchamp_adam_new(torchamp_tensor* const* params, size_t count,
                                                 const torchamp_adam_options* options,
                                                 torchamp_optimizer** out);
TORCHAMP_C_API torchamp_status torchamp_adamw_new(torchamp_tensor* const* params, size_t count,
                                                  const torchamp_adam_options* options,
                                                  torchamp_optimizer** out);
TORCHAMP_C_API void torchamp_optimizer_free(torchamp_optimizer* optimizer);
/* optimizer.step() without a scaler. */
TORCHAMP_C_API torchamp_status torchamp_optimizer_step(torchamp_optimizer* optimizer);
/* Python's zero_grad(set_to_none): drops the gradients, or zeroes them in
 * place (detached first only if they have a grad_fn, as Python does, so
 * DDP's bucket views can be zeroed). */
TORCHAMP_C_API torchamp_status torchamp_optimizer_zero_grad(torchamp_optimizer* optimizer,
                                                            int32_t set_to_none);
/* torch::save(optimizer, path) / torch::load(optimizer, path): LibTorch's
 * format, which C++ programs read and write. */
TORCHAMP_C_API torchamp_status torchamp_optimizer_save(const torchamp_optimizer* optimizer,
                                                       const char* path);
TORCHAMP_C_API torchamp_status torchamp_optimizer_load(torchamp_optimizer* optimizer,
                                                       const char* path);
/* The float32 master copy of a parameter: a new handle, or NULL before the
 * parameter's first step and without master_weights. */
TORCHAMP_C_API torchamp_status torchamp_optimizer_master_weight(const torchamp_optimizer* optimizer,
                                                                const torchamp_tensor* param,
                                                                torchamp_tensor** out);

/* ---- scalers: torchamp::GradScaler and torchamp::paddle::GradScaler ---- */

typedef struct torchamp_scaler torchamp_scaler;

/* torchamp::GradScalerOptions's fields (booleans as 0/1). */
typedef struct torchamp_scaler_options {
  double init_scale;
  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int64_t backoff_interval;
  double min_scale;
  int64_t max_consecutive_skips;
  int32_t enabled;
  int32_t dynamic;
  int32_t unscale_float16;
  int32_t reserved; /* 0 */
} torchamp_scaler_options;

/* paddle.amp.GradScaler's arguments. */
typedef struct torchamp_paddle_options {
  double init_loss_scaling;
  double incr_ratio;
  double decr_ratio;
  int64_t incr_every_n_steps;
  int64_t decr_every_n_nan_or_inf;
  int32_t enable;
  int32_t use_dynamic_loss_scaling;
} torchamp_paddle_options;

/* The defaults: PyTorch's (2^16, x2, x0.5, every 2000) and Paddle's
 * (2^15, x2, x0.5, every 1000, after 2 overflows; read off a Paddle scaler,
 * so this one can fail, out of memory). */
TORCHAMP_C_API void torchamp_scaler_options_default(torchamp_scaler_options* options);
TORCHAMP_C_API torchamp_status torchamp_paddle_options_default(torchamp_paddle_options* options);

/* A scaler (NULL options: the defaults). Both kinds take every call below
 * but clip_grad_norm_ and update_to, which are PyTorch's only. */
TORCHAMP_C_API torchamp_status torchamp_scaler_new(const torchamp_scaler_options* options,
                                                   torchamp_scaler** out);
TORCHAMP_C_API torchamp_status torchamp_paddle_scaler_new(const torchamp_paddle_options* options,
                                                          torchamp_scaler** out);
TORCHAMP_C_API void torchamp_scaler_free(torchamp_scaler* scaler);

/* scale(output): output * scale, a new tensor. */
TORCHAMP_C_API torchamp_status torchamp_scaler_scale(torchamp_scaler* scaler,
                                                     const torchamp_tensor* output,
                                                     torchamp_tensor** out);
/* unscale_(optimizer): divides the optimizer's gradients by the scale. */
TORCHAMP_C_API torchamp_status torchamp_scaler_unscale_(torchamp_scaler* scaler,
                                                        torchamp_optimizer* optimizer);
/* unscale_ then clip the gradients' norm to max_norm; *norm: the real norm. */
TORCHAMP_C_API torchamp_status torchamp_scaler_clip_grad_norm_(torchamp_scaler* scaler,
                                                               torchamp_optimizer* optimizer,
                                                               double max_norm, double* norm);
/* step(optimizer); *stepped (may be NULL): 1 if it stepped, 0 if it skipped
 * the step for an inf/NaN gradient. */
TORCHAMP_C_API torchamp_status torchamp_scaler_step(torchamp_scaler* scaler,
                                                    torchamp_optimizer* optimizer,
                                                    int32_t* stepped);
/* update(): grow or back off the scale. */
TORCHAMP_C_API torchamp_status torchamp_scaler_update(torchamp_scaler* scaler);
/* update(new_scale): set the scale. */
TORCHAMP_C_API torchamp_status torchamp_scaler_update_to(torchamp_scaler* scaler, double new_scale);
TORCHAMP_C_API torchamp_status torchamp_scaler_get_scale(const torchamp_scaler* scaler,
                                                         double* scale);
/* state_dict(): PyTorch's keys and torchamp's (Paddle's for a Paddle
 * scaler, whose tensor "scale" is its value here), in the C++ order. */
TORCHAMP_C_API torchamp_status torchamp_scaler_state_dict(const torchamp_scaler* scaler,
                                                          torchamp_state** out);
/* load_state_dict(): any schema, all or nothing. */
TORCHAMP_C_API torchamp_status torchamp_scaler_load_state_dict(torchamp_scaler* scaler,
                                                               const torchamp_entry* entries,
                                                               size_t count);
/* The state dict pickled (torch::pickle_save): Python's
 * `scaler.load_state_dict(torch.load(path))` reads it, and the load reads
 * what Python's `torch.save(scaler.state_dict(), path)` wrote. */
TORCHAMP_C_API torchamp_status torchamp_scaler_save(const torchamp_scaler* scaler,
                                                    const char* path);
TORCHAMP_C_API torchamp_status torchamp_scaler_load(torchamp_scaler* scaler, const char* path);

/* ---- autocast ---- */

enum { TORCHAMP_DEVICE_CPU = 0, TORCHAMP_DEVICE_CUDA = 1 };
/* dtypes are c10::ScalarType's numbers (tch's Kind, TorchSharp's ScalarType). */
enum { TORCHAMP_DTYPE_DEFAULT = -1, TORCHAMP_DTYPE_FLOAT16 = 5, TORCHAMP_DTYPE_BFLOAT16 = 15 };

typedef struct torchamp_autocast torchamp_autocast;
/* torchamp::autocast(device, dtype, enabled): the region begins. Autocast
 * is per thread: exit and free a guard on the thread that began it. */
TORCHAMP_C_API torchamp_status torchamp_autocast_enter(int32_t device_type, int32_t dtype,
                                                       int32_t enabled, torchamp_autocast** out);
/* Ends the region (Python: the end of the with block); again: nothing. */
TORCHAMP_C_API torchamp_status torchamp_autocast_exit(torchamp_autocast* guard);
/* Ends the region if it is still open, and frees the guard. */
TORCHAMP_C_API void torchamp_autocast_free(torchamp_autocast* guard);

/* ---- process groups and DDP (in a build without distributed support,
 *      every call that returns a status returns
 *      TORCHAMP_NOT_IMPLEMENTED_ERROR) ---- */

typedef struct torchamp_process_group torchamp_process_group;
/* torchamp::init_process_group: backend "gloo"/"nccl" (NULL or "": the
 * device's default), init_method "env://", "tcp://host:port" or
 * "file:///path" (NULL: env://), rank and world_size (-1: from the
 * environment). Becomes the default group until torchamp_destroy_process_group. */
TORCHAMP_C_API torchamp_status torchamp_init_process_group(const char* backend,
                                                           const char* init_method, int32_t rank,
                                                           int32_t world_size,
                                                           torchamp_process_group** out);
TORCHAMP_C_API torchamp_status torchamp_process_group_rank(const torchamp_process_group* group,
                                                           int32_t* rank);
TORCHAMP_C_API torchamp_status torchamp_process_group_size(const torchamp_process_group* group,
                                                           int32_t* size);
/* Releases this handle (the group lives on while a DDP or scaler uses it). */
TORCHAMP_C_API void torchamp_process_group_free(torchamp_process_group* group);
/* torchamp::destroy_process_group(): forgets the default group. */
TORCHAMP_C_API torchamp_status torchamp_destroy_process_group(void);
/* set_process_group(scaler, group): every rank skips when any rank found
 * inf/NaN. A NULL group removes it. */
TORCHAMP_C_API torchamp_status torchamp_scaler_set_process_group(torchamp_scaler* scaler,
                                                                 torchamp_process_group* group);

typedef struct torchamp_ddp torchamp_ddp;
/* torchamp::DistributedDataParallelOptions (bucket_cap_mb <= 0: the default 25). */
typedef struct torchamp_ddp_options {
  double bucket_cap_mb;
  int32_t find_unused_parameters;
  int32_t gradient_as_bucket_view;
  int32_t average_gradients;
  int32_t reserved; /* 0 */
} torchamp_ddp_options;
TORCHAMP_C_API void torchamp_ddp_options_default(torchamp_ddp_options* options);
/* DDP over a module made of these parameters (no buffers): broadcasts rank
 * 0's values into them, then averages their gradients during backward. */
TORCHAMP_C_API torchamp_status torchamp_ddp_new(torchamp_process_group* group,
                                                torchamp_tensor* const* params, size_t count,
                                                const torchamp_ddp_options* options,
                                                torchamp_ddp** out);
/* Call after each forward, before its backward, with the forward's outputs
 * (needed with find_unused_parameters): what DistributedDataParallel::forward
 * does around the module's forward. */
TORCHAMP_C_API torchamp_status torchamp_ddp_prepare_backward(torchamp_ddp* ddp,
                                                             torchamp_tensor* const* outputs,
                                                             size_t count);
/* Accumulation (DistributedDataParallel::no_sync; Python's
 * require_backward_grad_sync): with sync 0, the backward after each
 * following prepare_backward keeps its gradients local, adding to those
 * there; with sync 1 (the default) the next one reduces the sum. Any other
 * value: TORCHAMP_VALUE_ERROR, and nothing changes. */
TORCHAMP_C_API torchamp_status torchamp_ddp_set_sync(torchamp_ddp* ddp, int32_t sync);
/* The buckets (DistributedDataParallel::bucket_indices()), for a checkpoint:
 * bucket b holds sizes[b] parameters, and indices lists each bucket's
 * parameters (positions in torchamp_ddp_new's params) in turn, every one
 * once. *bucket_count: in, the room in sizes; out, the number of buckets.
 * With sizes NULL only *bucket_count is set. index_capacity: the room in
 * indices, at least the parameter count. Too little room:
 * TORCHAMP_VALUE_ERROR, nothing written. */
TORCHAMP_C_API torchamp_status torchamp_ddp_bucket_indices(torchamp_ddp* ddp, int64_t* sizes,
                                                           size_t* bucket_count, int64_t* indices,
                                                           size_t index_capacity);
/* DistributedDataParallel::set_bucket_indices: a checkpoint's buckets, as
 * torchamp_ddp_bucket_indices gave them, so that a resumed run adds its
 * gradients in the uninterrupted run's order (on 3 or more ranks the bits
 * depend on it). Collective: every rank calls it, between iterations, and
 * every rank takes rank 0's buckets (a rank whose arguments are refused
 * before that leaves the others waiting until the group's timeout).
 * Buckets that are not each parameter once, or sizes that do not add up
 * to index_count: TORCHAMP_VALUE_ERROR naming the value, nothing changed. */
TORCHAMP_C_API torchamp_status torchamp_ddp_set_bucket_indices(torchamp_ddp* ddp,
                                                               const int64_t* sizes,
                                                               size_t bucket_count,
                                                               const int64_t* indices,
                                                               size_t index_count);
TORCHAMP_C_API void torchamp_ddp_free(torchamp_ddp* ddp);

#ifdef __cplusplus
}
#endif

#endif /* TORCHAMP_C_TORCHAMP_H */
