/* The C ABI's whole surface from C, beyond the trace the bindings share:
 * every handle kind, NULLs and bad values with their typed statuses (and
 * nothing changed), the Paddle scaler, autocast, Adam/AdamW with master
 * weights, save/load, and two ranks of a Gloo process group with DDP and
 * found-inf agreement (the program forks; the ranks meet in a file store).
 *
 *   binding_abi WORK_DIR */
#define _POSIX_C_SOURCE 200809L

#include "shim/shim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;
static int rank = -1;

#define EXPECT(cond)                                                                               \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "[rank %d] %s:%d: expected %s (last error: %s)\n", rank, __FILE__, __LINE__, \
              #cond, torchamp_last_error());                                                       \
      ++failures;                                                                                  \
    }                                                                                              \
  } while (0)

#define OK(call) EXPECT((call) == TORCHAMP_OK)

/* A call fails with `status` and a message containing `text`. */
#define FAILS(call, status, text)                                             \
  do {                                                                        \
    torchamp_status got_ = (call);                                            \
    EXPECT(got_ == (status));                                                 \
    EXPECT(torchamp_last_status() == (status));                               \
    if (strstr(torchamp_last_error(), (text)) == NULL) {                      \
      fprintf(stderr, "%s:%d: message '%s' lacks '%s'\n", __FILE__, __LINE__, \
              torchamp_last_error(), (text));                                 \
      ++failures;                                                             \
    }                                                                         \
  } while (0)

/* A scaler call fails as FAILS says, and the scaler's whole state dict is as
 * it was. */
#define FAILS_UNCHANGED(scaler, call, status, text) \
  do {                                              \
    torchamp_state* before_ = snapshot(scaler);     \
    torchamp_state* after_;                         \
    FAILS(call, status, text);                      \
    after_ = snapshot(scaler);                      \
    EXPECT(same_state(before_, after_));            \
    torchamp_state_free(before_);                   \
    torchamp_state_free(after_);                    \
  } while (0)

static torchamp_state* snapshot(const torchamp_scaler* scaler) {
  torchamp_state* state = NULL;
  OK(torchamp_scaler_state_dict(scaler, &state));
  return state;
}

/* Whether two state dicts hold the same keys, kinds and bits. */
static int same_state(const torchamp_state* a, const torchamp_state* b) {
  const torchamp_entry *ea, *eb;
  size_t na, nb;
  if (torchamp_state_entries(a, &ea, &na) != TORCHAMP_OK ||
      torchamp_state_entries(b, &eb, &nb) != TORCHAMP_OK || na != nb) {
    return 0;
  }
  for (size_t i = 0; i < na; ++i) {
    if (strcmp(ea[i].key, eb[i].key) != 0 || ea[i].kind != eb[i].kind ||
        memcmp(&ea[i].f, &eb[i].f, sizeof ea[i].f) != 0 || ea[i].i != eb[i].i) {
      return 0;
    }
  }
  return 1;
}

/* The value of `key` in a scaler's state dict (NAN if absent). */
static double state_value(const torchamp_scaler* scaler, const char* key) {
  torchamp_state* state;
  const torchamp_entry* e;
  size_t n;
  double value = NAN;
  if (torchamp_scaler_state_dict(scaler, &state) != TORCHAMP_OK)
    return NAN;
  OK(torchamp_state_entries(state, &e, &n));
  for (size_t i = 0; i < n; ++i) {
    if (strcmp(e[i].key, key) == 0)
      value = e[i].kind == TORCHAMP_KIND_DOUBLE ? e[i].f : e[i].i;
  }
  torchamp_state_free(state);
  return value;
}

static size_t state_size(const torchamp_scaler* scaler) {
  torchamp_state* state;
  const torchamp_entry* e;
  size_t n = 0;
  OK(torchamp_scaler_state_dict(scaler, &state));
  OK(torchamp_state_entries(state, &e, &n));
  torchamp_state_free(state);
  return n;
}

static void test_handles_and_nulls(void) {
  torchamp_scaler* scaler = (torchamp_scaler*)&failures; /* a sentinel: must stay */
  torchamp_scaler_options options;
  torchamp_optimizer* optimizer = NULL;
  torchamp_tensor* params[2] = {NULL, NULL};
  double scale = 0;

  EXPECT(torchamp_abi_version() == TORCHAMP_C_ABI_VERSION);
  EXPECT(strcmp(torchamp_version(), "0.1.0") == 0);

  FAILS(torchamp_scaler_new(NULL, NULL), TORCHAMP_TYPE_ERROR, "torchamp_scaler_new: out is NULL");
  torchamp_scaler_options_default(&options);
  EXPECT(options.init_scale == 65536.0 && options.growth_interval == 2000 && options.enabled == 1);
  options.init_scale = -1;
  FAILS(torchamp_scaler_new(&options, &scaler), TORCHAMP_VALUE_ERROR,
        "init_scale must be a finite number > 0, got -1");
  EXPECT(scaler == (torchamp_scaler*)&failures);
  options.init_scale = 1024;
  OK(torchamp_scaler_new(&options, &scaler));
  OK(torchamp_scaler_get_scale(scaler, &scale));
  EXPECT(scale == 1024);
  FAILS(torchamp_scaler_get_scale(scaler, NULL), TORCHAMP_TYPE_ERROR, "scale is NULL");
  FAILS_UNCHANGED(scaler, torchamp_scaler_update_to(scaler, -2), TORCHAMP_VALUE_ERROR,
                  "scale must be a finite number > 0, got -2");
  FAILS_UNCHANGED(scaler, torchamp_scaler_update(scaler), TORCHAMP_RUNTIME_ERROR,
                  "No inf checks were recorded prior to update.");
  OK(torchamp_scaler_update_to(scaler, 2048));
  OK(torchamp_scaler_get_scale(scaler, &scale));
  EXPECT(scale == 2048);

  FAILS(torchamp_sgd_new(NULL, 2, NULL, &optimizer), TORCHAMP_TYPE_ERROR, "params is NULL");
  params[0] = shim_full(2, 2, 1.0, 6, 1);
  FAILS(torchamp_sgd_new(params, 2, NULL, &optimizer), TORCHAMP_TYPE_ERROR, "params[1] is NULL");
  EXPECT(optimizer == NULL);
  FAILS_UNCHANGED(scaler, torchamp_scaler_unscale_(scaler, NULL), TORCHAMP_TYPE_ERROR,
                  "torchamp_scaler_unscale_: optimizer is NULL");
  FAILS(torchamp_state_entries(NULL, NULL, NULL), TORCHAMP_TYPE_ERROR, "state is NULL");

  /* Freeing NULL is nothing, as free(NULL). */
  torchamp_scaler_free(NULL);
  torchamp_optimizer_free(NULL);
  torchamp_tensor_free(NULL);
  torchamp_state_free(NULL);
  torchamp_autocast_free(NULL);
  torchamp_ddp_free(NULL);
  torchamp_process_group_free(NULL);
  shim_free(params[0]);
  torchamp_scaler_free(scaler);
}

static void test_state_dicts(const char* work) {
  torchamp_scaler *a, *b;
  torchamp_state* state;
  const torchamp_entry* e;
  size_t n;
  torchamp_entry bad[16];
  char path[4096];

  OK(torchamp_scaler_new(NULL, &a));
  OK(torchamp_scaler_new(NULL, &b));
  OK(torchamp_scaler_update_to(a, 8.0));
  OK(torchamp_scaler_state_dict(a, &state));
  OK(torchamp_state_entries(state, &e, &n));
  EXPECT(n == 11);
  EXPECT(strcmp(e[0].key, "scale") == 0 && e[0].kind == TORCHAMP_KIND_DOUBLE && e[0].f == 8.0);
  EXPECT(strcmp(e[3].key, "growth_interval") == 0 && e[3].kind == TORCHAMP_KIND_INT &&
         e[3].i == 2000);
  memcpy(bad, e, n * sizeof *e);

  bad[0].kind = 7;
  FAILS_UNCHANGED(b, torchamp_scaler_load_state_dict(b, bad, n), TORCHAMP_VALUE_ERROR,
                  "entries[0] ('scale') has kind 7");
  bad[0].kind = TORCHAMP_KIND_DOUBLE;
  bad[1].key = NULL;
  FAILS_UNCHANGED(b, torchamp_scaler_load_state_dict(b, bad, n), TORCHAMP_TYPE_ERROR,
                  "entries[1].key is NULL");
  bad[1].key = e[1].key;
  bad[7].i = 2; /* "dynamic", a bool */
  FAILS_UNCHANGED(b, torchamp_scaler_load_state_dict(b, bad, n), TORCHAMP_VALUE_ERROR,
                  "expected 0 or 1");
  FAILS_UNCHANGED(b, torchamp_scaler_load_state_dict(b, e, 0), TORCHAMP_RUNTIME_ERROR,
                  "The source state dict is empty");
  FAILS_UNCHANGED(b, torchamp_scaler_load_state_dict(b, NULL, 3), TORCHAMP_TYPE_ERROR,
                  "entries is NULL");
  EXPECT(state_value(b, "scale") == 65536.0);
  OK(torchamp_scaler_load_state_dict(b, e, n));
  EXPECT(state_value(b, "scale") == 8.0);
  torchamp_state_free(state);

  /* Pickled save and load. */
  snprintf(path, sizeof path, "%s/scaler.pt", work);
  OK(torchamp_scaler_update_to(a, 4.0));
  OK(torchamp_scaler_save(a, path));
  OK(torchamp_scaler_load(b, path));
  EXPECT(state_value(b, "scale") == 4.0);
  snprintf(path, sizeof path, "%s/missing.pt", work);
  FAILS_UNCHANGED(b, torchamp_scaler_load(b, path), TORCHAMP_RUNTIME_ERROR,
                  "torchamp_scaler_load: cannot open");
  snprintf(path, sizeof path, "%s/garbage.pt", work);
  {
    FILE* f = fopen(path, "wb");
    fputs("not a pickle", f);
    fclose(f);
  }
  {
    torchamp_state* before = snapshot(b);
    torchamp_state* after;
    EXPECT(torchamp_scaler_load(b, path) != TORCHAMP_OK);
    after = snapshot(b);
    EXPECT(same_state(before, after));
    torchamp_state_free(before);
    torchamp_state_free(after);
  }
  /* A save over an existing file: the new state, and no file beside it. */
  snprintf(path, sizeof path, "%s/scaler.pt", work);
  OK(torchamp_scaler_update_to(a, 2.0));
  OK(torchamp_scaler_save(a, path));
  OK(torchamp_scaler_load(b, path));
  EXPECT(state_value(b, "scale") == 2.0);
  snprintf(path, sizeof path, "%s/scaler.pt.partial", work);
  EXPECT(access(path, F_OK) != 0);
  snprintf(path, sizeof path, "%s/no-such-folder/scaler.pt", work);
  FAILS(torchamp_scaler_save(a, path), TORCHAMP_RUNTIME_ERROR, "cannot open");
  torchamp_scaler_free(a);
  torchamp_scaler_free(b);
}

static void test_paddle(void) {
  torchamp_paddle_options options;
  torchamp_scaler *paddle, *core;
  torchamp_optimizer* optimizer;
  torchamp_tensor* w = shim_full(1, 2, 1.0, 6, 1);
  torchamp_tensor* inf = shim_full(1, 2, INFINITY, 6, 0);
  torchamp_state* state;
  const torchamp_entry* e;
  size_t n;
  int32_t stepped = -1;
  double norm;

  FAILS(torchamp_paddle_options_default(NULL), TORCHAMP_TYPE_ERROR, "options is NULL");
  OK(torchamp_paddle_options_default(&options));
  EXPECT(options.init_loss_scaling == 32768.0 && options.incr_every_n_steps == 1000 &&
         options.decr_every_n_nan_or_inf == 2 && options.enable == 1);
  options.decr_ratio = 1.5;
  FAILS(torchamp_paddle_scaler_new(&options, &paddle), TORCHAMP_VALUE_ERROR, "1.5");
  OK(torchamp_paddle_scaler_new(NULL, &paddle));
  EXPECT(state_size(paddle) == 8);
  EXPECT(state_value(paddle, "incr_ratio") == 2.0);
  EXPECT(state_value(paddle, "use_dynamic_loss_scaling") == 1.0);

  /* Two overflows in a row before Paddle backs off. */
  OK(torchamp_sgd_new(&w, 1, NULL, &optimizer));
  for (int i = 0; i < 2; ++i) {
    shim_set_grad(w, inf);
    OK(torchamp_scaler_step(paddle, optimizer, &stepped));
    EXPECT(stepped == 0);
    OK(torchamp_scaler_update(paddle));
    EXPECT(state_value(paddle, "scale") == (i == 0 ? 32768.0 : 16384.0));
  }
  EXPECT(shim_value(w, 0) == 1.0);
  FAILS_UNCHANGED(paddle, torchamp_scaler_clip_grad_norm_(paddle, optimizer, 1.0, &norm),
                  TORCHAMP_TYPE_ERROR, "Paddle");
  FAILS_UNCHANGED(paddle, torchamp_scaler_update_to(paddle, 2.0), TORCHAMP_TYPE_ERROR, "Paddle");

  /* Paddle's schema loads into a PyTorch scaler too (its keys are told apart). */
  OK(torchamp_scaler_state_dict(paddle, &state));
  OK(torchamp_state_entries(state, &e, &n));
  OK(torchamp_scaler_new(NULL, &core));
  OK(torchamp_scaler_load_state_dict(core, e, n));
  EXPECT(state_value(core, "scale") == 16384.0);
  OK(torchamp_scaler_load_state_dict(paddle, e, n));
  torchamp_state_free(state);

  /* clip_grad_norm_ on the PyTorch scaler: the real norm. */
  {
    torchamp_tensor* g = shim_full(1, 2, 3.0 * 16384.0, 6, 0);
    shim_set_grad(w, g);
    OK(torchamp_scaler_clip_grad_norm_(core, optimizer, 100.0, &norm));
    EXPECT(fabs(norm - sqrt(18.0)) < 1e-6);
    OK(torchamp_scaler_step(core, optimizer, &stepped));
    EXPECT(stepped == 1);
    OK(torchamp_scaler_update(core));
    shim_free(g);
  }
  torchamp_optimizer_free(optimizer);
  torchamp_scaler_free(core);
  torchamp_scaler_free(paddle);
  shim_free(inf);
  shim_free(w);
}

static void test_autocast(void) {
  torchamp_autocast *guard = NULL, *inner;
  torchamp_tensor* x = shim_full(2, 4, 1.0, 6, 0);
  torchamp_tensor* w = shim_full(3, 4, 0.5, 6, 1);
  torchamp_tensor* b = shim_full(1, 3, 0.0, 6, 1);
  torchamp_tensor* out;

  FAILS(torchamp_autocast_enter(7, TORCHAMP_DTYPE_DEFAULT, 1, &guard), TORCHAMP_VALUE_ERROR,
        "device_type must be");
  FAILS(torchamp_autocast_enter(TORCHAMP_DEVICE_CPU, 99, 1, &guard), TORCHAMP_VALUE_ERROR,
        "got 99");
  EXPECT(guard == NULL);
  OK(torchamp_autocast_enter(TORCHAMP_DEVICE_CPU, TORCHAMP_DTYPE_BFLOAT16, 1, &guard));
  out = shim_linear(x, w, b);
  EXPECT(shim_dtype(out) == TORCHAMP_DTYPE_BFLOAT16);
  shim_free(out);
  /* A disabled inner region: float32 inside it, bfloat16 again after. */
  OK(torchamp_autocast_enter(TORCHAMP_DEVICE_CPU, TORCHAMP_DTYPE_DEFAULT, 0, &inner));
  out = shim_linear(x, w, b);
  EXPECT(shim_dtype(out) == 6);
  shim_free(out);
  torchamp_autocast_free(inner); /* free without exit ends the region */
  out = shim_linear(x, w, b);
  EXPECT(shim_dtype(out) == TORCHAMP_DTYPE_BFLOAT16);
  shim_free(out);
  OK(torchamp_autocast_exit(guard));
  OK(torchamp_autocast_exit(guard)); /* again: nothing */
  out = shim_linear(x, w, b);
  EXPECT(shim_dtype(out) == 6);
  shim_free(out);
  torchamp_autocast_free(guard);
  shim_free(b);
  shim_free(w);
  shim_free(x);
}

static void test_optimizers(const char* work) {
  torchamp_adam_options adam, adamw;
  torchamp_optimizer *opt, *again;
  torchamp_scaler* scaler;
  torchamp_tensor* p = shim_full(1, 4, 1.0, TORCHAMP_DTYPE_BFLOAT16, 1);
  torchamp_tensor* g = shim_full(1, 4, 1024.0, TORCHAMP_DTYPE_BFLOAT16, 0);
  torchamp_tensor* master = NULL;
  int32_t stepped;
  char path[4096];

  torchamp_adam_options_default(&adam);
  torchamp_adamw_options_default(&adamw);
  EXPECT(adam.lr == 1e-3 && adam.beta2 == 0.999 && adam.weight_decay == 0.0);
  EXPECT(adamw.weight_decay == 1e-2);

  adam.lr = -1;
  FAILS(torchamp_adam_new(&p, 1, &adam, &opt), TORCHAMP_RUNTIME_ERROR, "learning rate");
  adam.lr = 0.1;
  adam.master_weights = 1;
  OK(torchamp_adam_new(&p, 1, &adam, &opt));
  master = p; /* a sentinel: must become NULL */
  OK(torchamp_optimizer_master_weight(opt, p, &master));
  EXPECT(master == NULL); /* none before the first step */

  /* A scaled bfloat16 gradient: the fused step unscales it (scale 1024). */
  OK(torchamp_scaler_new(NULL, &scaler));
  OK(torchamp_scaler_update_to(scaler, 1024.0));
  shim_set_grad(p, g);
  OK(torchamp_scaler_step(scaler, opt, &stepped));
  EXPECT(stepped == 1);
  OK(torchamp_scaler_update(scaler));
  OK(torchamp_optimizer_master_weight(opt, p, &master));
  EXPECT(master != NULL && shim_dtype(master) == 6);
  EXPECT(master != NULL && fabs(shim_value(master, 0) - 0.9) < 1e-6); /* Adam: lr * sign */
  torchamp_tensor_free(master);

  /* zero_grad: zeroes, or drops. */
  OK(torchamp_optimizer_zero_grad(opt, 0));
  EXPECT(shim_grad_item(p, 0) == 0.0);
  OK(torchamp_optimizer_zero_grad(opt, 1));
  EXPECT(isnan(shim_grad_item(p, 0)));

  /* Save and load in LibTorch's format. */
  snprintf(path, sizeof path, "%s/adam.pt", work);
  OK(torchamp_optimizer_save(opt, path));
  OK(torchamp_adam_new(&p, 1, &adam, &again));
  OK(torchamp_optimizer_load(again, path));
  snprintf(path, sizeof path, "%s/missing.pt", work);
  EXPECT(torchamp_optimizer_load(again, path) != TORCHAMP_OK);
  torchamp_optimizer_free(again);
  {
    /* Adam's file into an SGD: refused. */
    torchamp_optimizer* sgd;
    OK(torchamp_sgd_new(&p, 1, NULL, &sgd));
    snprintf(path, sizeof path, "%s/adam.pt", work);
    EXPECT(torchamp_optimizer_load(sgd, path) != TORCHAMP_OK);
    torchamp_optimizer_free(sgd);
  }

  /* AdamW, and a plain step without a scaler. */
  {
    torchamp_tensor* q = shim_full(1, 2, 1.0, 6, 1);
    torchamp_tensor* qg = shim_full(1, 2, 1.0, 6, 0);
    adamw.lr = 0.1;
    OK(torchamp_adamw_new(&q, 1, &adamw, &again));
    shim_set_grad(q, qg);
    OK(torchamp_optimizer_step(again));
    EXPECT(fabs(shim_value(q, 0) - (1.0 - 0.1 * 0.01 - 0.1)) < 1e-6);
    torchamp_optimizer_free(again);
    shim_free(qg);
    shim_free(q);
  }
  torchamp_scaler_free(scaler);
  torchamp_optimizer_free(opt);
  shim_free(g);
  shim_free(p);
}

#if TORCHAMP_TEST_DISTRIBUTED
/* A forward and backward under `ddp`; each of the 5 gradients (w's 4, then
 * b's) must be k_local * local + k_other * other. */
static void reduced_backward(torchamp_ddp* ddp, torchamp_tensor* x, torchamp_tensor* y,
                             torchamp_tensor* w, torchamp_tensor* b, const float* local,
                             const float* other, float k_local, float k_other, const char* what) {
  torchamp_tensor* out = shim_linear(x, w, b);
  torchamp_tensor* loss;
  OK(torchamp_ddp_prepare_backward(ddp, &out, 1));
  loss = shim_mse_loss(out, y);
  shim_backward(loss);
  for (int i = 0; i < 5; ++i) {
    const float got = (float)shim_grad_item(i < 4 ? w : b, i < 4 ? i : 0);
    const float expected = k_local * local[i] + k_other * other[i];
    if (got != expected) {
      fprintf(stderr, "[rank %d] %s, gradient %d: %.9g, expected %.9g\n", rank, what, i, got,
              expected);
      ++failures;
    }
  }
  shim_free(loss);
  shim_free(out);
}
#endif

/* One rank of the distributed test. */
static int distributed_rank(const char* work) {
#if !TORCHAMP_TEST_DISTRIBUTED
  torchamp_process_group* group = NULL;
  (void)work;
  if (rank == 0) {
    FAILS(torchamp_init_process_group("gloo", "file:///nonexistent", 0, 1, &group),
          TORCHAMP_NOT_IMPLEMENTED_ERROR, "without distributed support");
  }
  return failures;
#else
  char path[4096], init[4200];
  torchamp_process_group* group;
  torchamp_ddp* ddp;
  torchamp_ddp_options options;
  torchamp_optimizer* optimizer;
  torchamp_scaler* scaler;
  torchamp_tensor *w, *b, *x, *y, *out, *loss;
  torchamp_tensor* params[2];
  float local[5], other[5];
  int32_t size = 0, got_rank = -1, stepped = -1;

  shim_manual_seed(0);
  shim_linear_init(4, 1, &w, &b);
  params[0] = w;
  params[1] = b;
  shim_manual_seed(100 + (uint64_t)rank);
  x = shim_randn(8, 4);
  y = shim_randn(8, 1);
  OK(torchamp_sgd_new(params, 2, NULL, &optimizer));

  /* This rank's own gradients, for the check. */
  out = shim_linear(x, w, b);
  loss = shim_mse_loss(out, y);
  shim_backward(loss);
  for (int i = 0; i < 5; ++i)
    local[i] = (float)shim_grad_item(i < 4 ? w : b, i < 4 ? i : 0);
  snprintf(path, sizeof path, "%s/grads%d", work, rank);
  {
    FILE* f = fopen(path, "wb");
    fwrite(local, sizeof local, 1, f);
    fclose(f);
  }
  shim_free(loss);
  shim_free(out);
  OK(torchamp_optimizer_zero_grad(optimizer, 1));

  snprintf(init, sizeof init, "file://%s/store", work);
  OK(torchamp_init_process_group("gloo", init, rank, 2, &group));
  OK(torchamp_process_group_size(group, &size));
  OK(torchamp_process_group_rank(group, &got_rank));
  EXPECT(size == 2 && got_rank == rank);

  torchamp_ddp_options_default(&options);
  EXPECT(options.average_gradients == 1 && options.bucket_cap_mb == 0.0);
  options.gradient_as_bucket_view = 1; /* zero_grad(0) below zeroes views */
  OK(torchamp_ddp_new(group, params, 2, &options, &ddp));
  out = shim_linear(x, w, b);
  OK(torchamp_ddp_prepare_backward(ddp, &out, 1));
  loss = shim_mse_loss(out, y);
  shim_backward(loss);
  /* Both ranks wrote their file before the all-reduce that backward waited on. */
  snprintf(path, sizeof path, "%s/grads%d", work, 1 - rank);
  {
    FILE* f = fopen(path, "rb");
    EXPECT(f != NULL && fread(other, sizeof other, 1, f) == 1);
    if (f != NULL)
      fclose(f);
  }
  for (int i = 0; i < 5; ++i) {
    const float averaged = (float)shim_grad_item(i < 4 ? w : b, i < 4 ? i : 0);
    const float expected = local[i] / 2 + other[i] / 2;
    if (averaged != expected) {
      fprintf(stderr, "[rank %d] gradient %d: %.9g, expected %.9g\n", rank, i, averaged, expected);
      ++failures;
    }
  }
  shim_free(loss);
  shim_free(out);
  /* The gradients are views into DDP's buckets: zeroed in place, as Python does. */
  OK(torchamp_optimizer_zero_grad(optimizer, 0));
  EXPECT(shim_grad_item(w, 0) == 0.0 && shim_grad_item(b, 0) == 0.0);

  /* Accumulation: a backward with sync 0 keeps this rank's gradients; the
   * next with sync 1 reduces the sum (2 local each: local + other). */
  FAILS(torchamp_ddp_set_sync(ddp, 2), TORCHAMP_VALUE_ERROR, "sync must be 0 or 1, got 2");
  FAILS(torchamp_ddp_set_sync(NULL, 0), TORCHAMP_TYPE_ERROR, "torchamp_ddp_set_sync: ddp is NULL");
  for (int sync = 0; sync <= 1; ++sync) {
    OK(torchamp_ddp_set_sync(ddp, sync));
    OK(torchamp_ddp_set_sync(ddp, sync)); /* again: nothing more */
    reduced_backward(ddp, x, y, w, b, local, other, 1.0f, sync ? 1.0f : 0.0f,
                     sync ? "sync 1" : "sync 0");
  }
  OK(torchamp_optimizer_zero_grad(optimizer, 0));

  /* The buckets, for a checkpoint: one, b then w (reduced last first). Too
   * little room writes nothing; they go back in; bad ones change nothing. */
  {
    int64_t sizes[4] = {-7, -7, -7, -7}, indices[2] = {-7, -7};
    const int64_t split[2] = {1, 1}, three[1] = {3}, twice[2] = {1, 1};
    size_t count = 0;
    OK(torchamp_ddp_bucket_indices(ddp, NULL, &count, NULL, 0));
    EXPECT(count == 1);
    count = 0;
    FAILS(torchamp_ddp_bucket_indices(ddp, sizes, &count, indices, 2), TORCHAMP_VALUE_ERROR,
          "there are 1 buckets, and *bucket_count gives room for 0");
    count = 4;
    FAILS(torchamp_ddp_bucket_indices(ddp, sizes, &count, indices, 1), TORCHAMP_VALUE_ERROR,
          "there are 2 parameters, and indices has room for 1");
    EXPECT(count == 4 && sizes[0] == -7 && indices[0] == -7);
    OK(torchamp_ddp_bucket_indices(ddp, sizes, &count, indices, 2));
    EXPECT(count == 1 && sizes[0] == 2 && indices[0] == 1 && indices[1] == 0);
    FAILS(torchamp_ddp_set_bucket_indices(ddp, three, 1, indices, 2), TORCHAMP_VALUE_ERROR,
          "sizes[0] is 3, but 2 of the 2 indices are left");
    FAILS(torchamp_ddp_set_bucket_indices(ddp, split, 1, indices, 2), TORCHAMP_VALUE_ERROR,
          "the sizes add up to 1, but index_count is 2");
    FAILS(torchamp_ddp_set_bucket_indices(ddp, sizes, 1, twice, 2), TORCHAMP_VALUE_ERROR,
          "index 1 (1) is in bucket 0 twice");
    FAILS(torchamp_ddp_set_bucket_indices(ddp, split, 2, NULL, 2), TORCHAMP_TYPE_ERROR,
          "indices is NULL");
    OK(torchamp_ddp_bucket_indices(ddp, sizes, &count, indices, 2));
    EXPECT(count == 1 && sizes[0] == 2); /* unchanged */
    /* Two buckets of one, from the next prepare_backward: reduced the same. */
    OK(torchamp_ddp_set_bucket_indices(ddp, split, 2, indices, 2));
    count = 4;
    OK(torchamp_ddp_bucket_indices(ddp, sizes, &count, indices, 2));
    EXPECT(count == 2 && sizes[0] == 1 && sizes[1] == 1 && indices[0] == 1 && indices[1] == 0);
    reduced_backward(ddp, x, y, w, b, local, other, 0.5f, 0.5f, "two buckets");
    /* After that first backward of the new Reducer: the one bucket its
     * rebuild at the next forward will make (both fit the 25 MiB cap). */
    count = 4;
    OK(torchamp_ddp_bucket_indices(ddp, sizes, &count, indices, 2));
    EXPECT(count == 1 && sizes[0] == 2);
    OK(torchamp_optimizer_zero_grad(optimizer, 0));
  }

  /* found-inf agreement: rank 1's gradient is inf, and both ranks skip. */
  OK(torchamp_scaler_new(NULL, &scaler));
  OK(torchamp_scaler_set_process_group(scaler, group));
  {
    torchamp_tensor* g = shim_full(1, 4, rank == 1 ? INFINITY : 1.0, 6, 0);
    torchamp_tensor* gb = shim_full(1, 1, 1.0, 6, 0);
    shim_set_grad(w, g);
    shim_set_grad(b, gb);
    OK(torchamp_scaler_step(scaler, optimizer, &stepped));
    EXPECT(stepped == 0);
    OK(torchamp_scaler_update(scaler));
    EXPECT(state_value(scaler, "scale") == 32768.0);
    shim_free(gb);
    shim_free(g);
  }
  torchamp_scaler_free(scaler);
  torchamp_ddp_free(ddp);
  torchamp_process_group_free(group);
  OK(torchamp_destroy_process_group());
  torchamp_optimizer_free(optimizer);
  shim_free(x);
  shim_free(y);
  shim_free(w);
  shim_free(b);
  return failures;
#endif
}

int main(int argc, char** argv) {
  pid_t child;
  int status = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: binding_abi WORK_DIR\n");
    return 2;
  }
  if (mkdir(argv[1], 0755) != 0 && errno != EEXIST) {
    perror(argv[1]);
    return 2;
  }
  {
    const char* stale[] = {"store", "grads0", "grads1"};
    char path[4096];
    for (int i = 0; i < 3; ++i) {
      snprintf(path, sizeof path, "%s/%s", argv[1], stale[i]);
      unlink(path);
    }
  }
  /* Fork first, before LibTorch starts threads. */
  child = fork();
  if (child == 0) {
    rank = 1;
    return distributed_rank(argv[1]) == 0 ? 0 : 1;
  }
  rank = 0;
  test_handles_and_nulls();
  test_state_dicts(argv[1]);
  test_paddle();
  test_autocast();
  test_optimizers(argv[1]);
  distributed_rank(argv[1]);
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "rank 1 failed\n");
    ++failures;
  }
  if (failures == 0)
    printf("binding_abi: every check passed\n");
  return failures == 0 ? 0 : 1;
}
