/* The binding trace (reference.cpp) through torchamp's C ABI, in C. It
 * prints the trace, or writes it to $TORCHAMP_TRACE; with
 * $TORCHAMP_CHECKPOINT_DIR set it also writes scaler.pt and optimizer.pt
 * there, for the C++ side to load. */
#include "shim/shim.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OK(call)                                                                        \
  do {                                                                                  \
    torchamp_status status_ = (call);                                                   \
    if (status_ != TORCHAMP_OK) {                                                       \
      fprintf(stderr, "%s:%d: %s: status %d: %s\n", __FILE__, __LINE__, #call, status_, \
              torchamp_last_error());                                                   \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

static uint32_t bits32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static uint64_t bits64(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

static void print_state(const char* prefix, const torchamp_scaler* scaler) {
  torchamp_state* state;
  const torchamp_entry* e;
  size_t n;
  OK(torchamp_scaler_state_dict(scaler, &state));
  OK(torchamp_state_entries(state, &e, &n));
  for (size_t i = 0; i < n; ++i) {
    if (e[i].kind == TORCHAMP_KIND_DOUBLE) {
      printf("%s %s 1 %016" PRIx64 "\n", prefix, e[i].key, bits64(e[i].f));
    } else {
      printf("%s %s %d %" PRId64 "\n", prefix, e[i].key, e[i].kind, e[i].i);
    }
  }
  torchamp_state_free(state);
}

/* Whether two scalers' state dicts are equal. */
static int same_state(const torchamp_state* a, const torchamp_state* b) {
  const torchamp_entry *ea, *eb;
  size_t na, nb;
  OK(torchamp_state_entries(a, &ea, &na));
  OK(torchamp_state_entries(b, &eb, &nb));
  if (na != nb)
    return 0;
  for (size_t i = 0; i < na; ++i) {
    if (strcmp(ea[i].key, eb[i].key) != 0 || ea[i].kind != eb[i].kind ||
        bits64(ea[i].f) != bits64(eb[i].f) || ea[i].i != eb[i].i)
      return 0;
  }
  return 1;
}

static torchamp_tensor* weight;
static torchamp_tensor* bias;
static torchamp_optimizer* optimizer;
static torchamp_tensor* xs[3];
static torchamp_tensor* ys[3];

/* One iteration of the quickstart's loop. */
static void iterate(int i, torchamp_scaler* scaler) {
  torchamp_autocast* guard;
  torchamp_tensor *out, *loss, *scaled;
  int32_t stepped;
  double scale;
  OK(torchamp_optimizer_zero_grad(optimizer, 1));
  OK(torchamp_autocast_enter(TORCHAMP_DEVICE_CPU, TORCHAMP_DTYPE_DEFAULT, 1, &guard));
  out = shim_linear(xs[i % 3], weight, bias);
  OK(torchamp_autocast_exit(guard));
  torchamp_autocast_free(guard);
  loss = shim_mse_loss(out, ys[i % 3]);
  OK(torchamp_scaler_scale(scaler, loss, &scaled));
  shim_backward(scaled);
  OK(torchamp_scaler_step(scaler, optimizer, &stepped));
  OK(torchamp_scaler_update(scaler));
  OK(torchamp_scaler_get_scale(scaler, &scale));
  printf("step %d loss %08" PRIx32 " scale %016" PRIx64 " stepped %d\n", i, bits32(shim_item(loss)),
         bits64(scale), stepped);
  shim_free(scaled);
  shim_free(loss);
  shim_free(out);
}

/* Runs a call that must fail; prints its status and message, and whether the
 * scaler's state is unchanged. */
#define EXPECT_ERROR(name, scaler, call)                                        \
  do {                                                                          \
    torchamp_state *before_, *after_;                                           \
    torchamp_status status_;                                                    \
    OK(torchamp_scaler_state_dict(scaler, &before_));                           \
    status_ = (call);                                                           \
    if (status_ == TORCHAMP_OK || torchamp_last_status() != status_) {          \
      fprintf(stderr, "%s: expected an error, got status %d\n", name, status_); \
      exit(1);                                                                  \
    }                                                                           \
    printf("error %s %d %s\n", name, status_, torchamp_last_error());           \
    OK(torchamp_scaler_state_dict(scaler, &after_));                            \
    printf("unchanged %d\n", same_state(before_, after_));                      \
    torchamp_state_free(before_);                                               \
    torchamp_state_free(after_);                                                \
  } while (0)

int main(void) {
  torchamp_scaler *scaler, *overflow, *loaded, *fresh;
  torchamp_scaler_options options;
  torchamp_sgd_options sgd;
  torchamp_tensor* params[2];
  torchamp_state* state;
  const torchamp_entry* entries;
  size_t count;

  const char* trace = getenv("TORCHAMP_TRACE");
  const char* dir = getenv("TORCHAMP_CHECKPOINT_DIR");
  if (trace != NULL && freopen(trace, "w", stdout) == NULL) {
    perror(trace);
    return 1;
  }
  if (torchamp_abi_version() != TORCHAMP_C_ABI_VERSION) {
    fprintf(stderr, "ABI %d, header %d\n", torchamp_abi_version(), TORCHAMP_C_ABI_VERSION);
    return 1;
  }
  shim_manual_seed(0);
  shim_linear_init(4, 1, &weight, &bias);
  params[0] = weight;
  params[1] = bias;
  torchamp_sgd_options_default(&sgd);
  sgd.lr = 0.01;
  OK(torchamp_sgd_new(params, 2, &sgd, &optimizer));
  for (int i = 0; i < 3; ++i) {
    xs[i] = shim_randn(8, 4);
    ys[i] = shim_randn(8, 1);
  }

  printf("run quickstart\n");
  OK(torchamp_scaler_new(NULL, &scaler));
  for (int i = 0; i < 3; ++i)
    iterate(i, scaler);
  {
    torchamp_tensor *out, *loss, *scaled;
    double norm, scale;
    int32_t stepped;
    OK(torchamp_optimizer_zero_grad(optimizer, 1));
    out = shim_linear(xs[0], weight, bias);
    loss = shim_mse_loss(out, ys[0]);
    OK(torchamp_scaler_scale(scaler, loss, &scaled));
    shim_backward(scaled);
    OK(torchamp_scaler_unscale_(scaler, optimizer));
    norm = shim_clip_grad_norm(params, 2, 1.0);
    OK(torchamp_scaler_step(scaler, optimizer, &stepped));
    OK(torchamp_scaler_update(scaler));
    OK(torchamp_scaler_get_scale(scaler, &scale));
    printf("clip norm %016" PRIx64 " scale %016" PRIx64 " stepped %d\n", bits64(norm),
           bits64(scale), stepped);
    shim_free(scaled);
    shim_free(loss);
    shim_free(out);
  }

  printf("run overflow\n");
  torchamp_scaler_options_default(&options);
  options.init_scale = ldexp(1.0, 127);
  options.growth_interval = 2;
  OK(torchamp_scaler_new(&options, &overflow));
  for (int i = 0; i < 6; ++i)
    iterate(i, overflow);
  print_state("state", overflow);
  OK(torchamp_scaler_new(NULL, &loaded));
  OK(torchamp_scaler_state_dict(overflow, &state));
  OK(torchamp_state_entries(state, &entries, &count));
  OK(torchamp_scaler_load_state_dict(loaded, entries, count));
  print_state("loaded", loaded);

  printf("errors\n");
  {
    torchamp_status status = torchamp_scaler_step(NULL, optimizer, NULL);
    printf("error null_handle %d %s\n", status, torchamp_last_error());
  }
  {
    torchamp_tensor* half = shim_full(1, 2, 1.0, TORCHAMP_DTYPE_FLOAT16, 1);
    torchamp_tensor* half_grad = shim_full(1, 2, 1.0, TORCHAMP_DTYPE_FLOAT16, 0);
    torchamp_optimizer* half_optimizer;
    shim_set_grad(half, half_grad);
    OK(torchamp_sgd_new(&half, 1, &sgd, &half_optimizer));
    OK(torchamp_scaler_new(NULL, &fresh));
    EXPECT_ERROR("float16_gradient", fresh, torchamp_scaler_unscale_(fresh, half_optimizer));
    torchamp_optimizer_free(half_optimizer);
    shim_free(half_grad);
    shim_free(half);
  }
  {
    torchamp_tensor *out, *loss, *scaled;
    OK(torchamp_optimizer_zero_grad(optimizer, 1));
    out = shim_linear(xs[0], weight, bias);
    loss = shim_mse_loss(out, ys[0]);
    OK(torchamp_scaler_scale(overflow, loss, &scaled));
    shim_backward(scaled);
    OK(torchamp_scaler_step(overflow, optimizer, NULL));
    EXPECT_ERROR("step_twice", overflow, torchamp_scaler_step(overflow, optimizer, NULL));
    OK(torchamp_scaler_update(overflow));
    shim_free(scaled);
    shim_free(loss);
    shim_free(out);
  }
  {
    torchamp_state* current;
    torchamp_entry garbled[16];
    OK(torchamp_scaler_state_dict(overflow, &current));
    OK(torchamp_state_entries(current, &entries, &count));
    if (count > 16)
      return 1;
    memcpy(garbled, entries, count * sizeof *entries);
    for (size_t i = 0; i < count; ++i) {
      if (strcmp(garbled[i].key, "scale") == 0)
        garbled[i].f = -1.0;
    }
    EXPECT_ERROR("garbled_state", overflow,
                 torchamp_scaler_load_state_dict(overflow, garbled, count));
    torchamp_state_free(current);
  }
  print_state("final", overflow);

  if (dir != NULL) {
    char path[4096];
    snprintf(path, sizeof path, "%s/scaler.pt", dir);
    OK(torchamp_scaler_save(overflow, path));
    snprintf(path, sizeof path, "%s/optimizer.pt", dir);
    OK(torchamp_optimizer_save(optimizer, path));
  }

  torchamp_state_free(state);
  torchamp_scaler_free(fresh);
  torchamp_scaler_free(loaded);
  torchamp_scaler_free(overflow);
  torchamp_scaler_free(scaler);
  torchamp_optimizer_free(optimizer);
  for (int i = 0; i < 3; ++i) {
    shim_free(xs[i]);
    shim_free(ys[i]);
  }
  shim_free(weight);
  shim_free(bias);
  return 0;
}
