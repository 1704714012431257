// The C ABI (include/torchamp/c/torchamp.h) over the C++ API: errors,
// tensors, state dicts, optimizers, scalers and autocast. Each entry point
// checks its pointers, then calls the C++ API inside `guarded`, so a C++
// exception becomes a status; the C++ calls change nothing when they throw,
// and the handle a call creates is stored through `out` last.

#include "c/handles.h"

#include <torchamp/autocast.h>
#include <torchamp/optim.h>
#include <torchamp/version.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>

namespace torchamp {
namespace c_api {
namespace {

thread_local std::string last_error;
thread_local torchamp_status last_status = TORCHAMP_OK;

StateDict empty_state() {
  return StateDict(c10::StringType::get(), c10::AnyType::get());
}

std::vector<char> read_file(const char* function, const char* path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, function, ": cannot open '", path, "' for reading");
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <class Base>
torchamp_optimizer* wrap_optimizer(std::unique_ptr<optim::Fused<Base>> typed) {
  auto handle = std::make_unique<torchamp_optimizer>();
  optim::Fused<Base>* raw = typed.get();
  handle->master_weight = [raw](const at::Tensor& p) { return raw->master_weight(p); };
  handle->impl = std::move(typed);
  return handle.release();
}

template <class Base, class Options>
std::unique_ptr<torchamp_optimizer> new_adam(torchamp_tensor* const* params, size_t count,
                                             const torchamp_adam_options& o, const char* function) {
  Options options(o.lr);
  options.betas(std::make_tuple(o.beta1, o.beta2))
      .eps(o.eps)
      .weight_decay(o.weight_decay)
      .amsgrad(o.amsgrad != 0);
  return std::unique_ptr<torchamp_optimizer>(wrap_optimizer(std::make_unique<optim::Fused<Base>>(
      tensors_of(params, count, function, "params"), options,
      optim::FusedOptions().master_weights(o.master_weights != 0))));
}

// LibTorch's defaults (PyTorch's) for Adam and AdamW.
template <class Options>
torchamp_adam_options adam_defaults(const Options& d) {
  return torchamp_adam_options{d.lr(),  std::get<0>(d.betas()), std::get<1>(d.betas()),
                               d.eps(), d.weight_decay(),       d.amsgrad() ? 1 : 0,
                               0};
}

// Paddle's defaults, as its scaler's constructor has them (it allocates).
torchamp_paddle_options paddle_defaults() {
  const torchamp::paddle::GradScaler d;
  return torchamp_paddle_options{d.get_init_loss_scaling(),
                                 d.get_incr_ratio(),
                                 d.get_decr_ratio(),
                                 d.get_incr_every_n_steps(),
                                 d.get_decr_every_n_nan_or_inf(),
                                 d.is_enable() ? 1 : 0,
                                 d.is_use_dynamic_loss_scaling() ? 1 : 0};
}

}  // namespace

std::vector<at::Tensor> tensors_of(torchamp_tensor* const* handles, size_t count,
                                   const char* function, const char* what) {
  TORCH_CHECK_TYPE(handles != nullptr || count == 0, function, ": ", what, " is NULL");
  std::vector<at::Tensor> tensors;
  tensors.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    TORCH_CHECK_TYPE(handles[i] != nullptr, function, ": ", what, "[", i, "] is NULL");
    tensors.push_back(tensor_of(handles[i]));
  }
  return tensors;
}

torchamp_status fail(torchamp_status status, const char* message) noexcept {
  try {
    last_error = message;
  } catch (...) {
    last_error.clear();  // no memory for the message: the status still tells the type
  }
  last_status = status;
  return status;
}

}  // namespace c_api
}  // namespace torchamp

using namespace torchamp::c_api;  // NOLINT: this file is the ABI's implementation

struct torchamp_state {
  std::vector<std::string> keys;
  std::vector<torchamp_entry> entries;
};

struct torchamp_autocast {
  template <class... Args>
  explicit torchamp_autocast(Args&&... args) : guard(std::forward<Args>(args)...) {}
  torchamp::autocast guard;
};

extern "C" {

const char* torchamp_last_error(void) {
  return last_error.c_str();
}
torchamp_status torchamp_last_status(void) {
  return last_status;
}
const char* torchamp_version(void) {
  return TORCHAMP_VERSION;
}
int32_t torchamp_abi_version(void) {
  return TORCHAMP_C_ABI_VERSION;
}

void torchamp_tensor_free(torchamp_tensor* tensor) {
  delete reinterpret_cast<at::Tensor*>(tensor);
}

// ---- state dicts ----

torchamp_status torchamp_state_entries(const torchamp_state* state, const torchamp_entry** entries,
                                       size_t* count) {
  return guarded([&] {
    const auto& s = need(state, "torchamp_state_entries", "state");
    need(entries, "torchamp_state_entries", "entries");
    need(count, "torchamp_state_entries", "count");
    *entries = s.entries.data();
    *count = s.entries.size();
  });
}

void torchamp_state_free(torchamp_state* state) {
  delete state;
}

// ---- optimizers ----

void torchamp_sgd_options_default(torchamp_sgd_options* options) {
  if (options != nullptr) {
    // LibTorch's SGDOptions has no default lr; PyTorch's is 1e-3.
    const torch::optim::SGDOptions d(1e-3);
    *options = torchamp_sgd_options{d.lr(),           d.momentum(),         d.dampening(),
                                    d.weight_decay(), d.nesterov() ? 1 : 0, 0};
  }
}

void torchamp_adam_options_default(torchamp_adam_options* options) {
  if (options != nullptr) {
    *options = adam_defaults(torch::optim::AdamOptions());
  }
}

void torchamp_adamw_options_default(torchamp_adam_options* options) {
  if (options != nullptr) {
    *options = adam_defaults(torch::optim::AdamWOptions());
  }
}

torchamp_status torchamp_sgd_new(torchamp_tensor* const* params, size_t count,
                                 const torchamp_sgd_options* options, torchamp_optimizer** out) {
  return make_into(out, "torchamp_sgd_new", [&] {
    torchamp_sgd_options o;
    torchamp_sgd_options_default(&o);
    if (options != nullptr) {
      o = *options;
    }
    torch::optim::SGDOptions sgd(o.lr);
    sgd.momentum(o.momentum)
        .dampening(o.dampening)
        .weight_decay(o.weight_decay)
        .nesterov(o.nesterov != 0);
    return std::unique_ptr<torchamp_optimizer>(
        wrap_optimizer(std::make_unique<torchamp::optim::SGD>(
            tensors_of(params, count, "torchamp_sgd_new", "params"), sgd,
            torchamp::optim::FusedOptions().master_weights(o.master_weights != 0))));
  });
}

torchamp_status torchamp_adam_new(torchamp_tensor* const* params, size_t count,
                                  const torchamp_adam_options* options, torchamp_optimizer** out) {
  return make_into(out, "torchamp_adam_new", [&] {
    torchamp_adam_options o;
    torchamp_adam_options_default(&o);
    return new_adam<torch::optim::Adam, torch::optim::AdamOptions>(
        params, count, options != nullptr ? *options : o, "torchamp_adam_new");
  });
}

torchamp_status torchamp_adamw_new(torchamp_tensor* const* params, size_t count,
                                   const torchamp_adam_options* options, torchamp_optimizer** out) {
  return make_into(out, "torchamp_adamw_new", [&] {
    torchamp_adam_options o;
    torchamp_adamw_options_default(&o);
    return new_adam<torch::optim::AdamW, torch::optim::AdamWOptions>(
        params, count, options != nullptr ? *options : o, "torchamp_adamw_new");
  });
}

void torchamp_optimizer_free(torchamp_optimizer* optimizer) {
  delete optimizer;
}

torchamp_status torchamp_optimizer_step(torchamp_optimizer* optimizer) {
  return guarded([&] { need(optimizer, "torchamp_optimizer_step", "optimizer").impl->step(); });
}

torchamp_status torchamp_optimizer_zero_grad(torchamp_optimizer* optimizer, int32_t set_to_none) {
  return guarded([&] {
    auto& opt = *need(optimizer, "torchamp_optimizer_zero_grad", "optimizer").impl;
    // Python's Optimizer.zero_grad (LibTorch 1.13's has no set_to_none, and
    // LibTorch's detach_ fails on DDP's bucket views, which have no grad_fn).
    for (auto& group : opt.param_groups()) {
      for (auto& p : group.params()) {
        at::Tensor& grad = p.mutable_grad();
        if (!grad.defined()) {
          continue;
        }
        if (set_to_none != 0) {
          grad.reset();
          continue;
        }
        if (grad.grad_fn()) {
          grad.detach_();
        } else {
          grad.requires_grad_(false);
        }
        grad.zero_();
      }
    }
  });
}

torchamp_status torchamp_optimizer_save(const torchamp_optimizer* optimizer, const char* path) {
  return guarded([&] {
    const auto& opt = *need(optimizer, "torchamp_optimizer_save", "optimizer").impl;
    need(path, "torchamp_optimizer_save", "path");
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    archive.save_to(path);
  });
}

torchamp_status torchamp_optimizer_load(torchamp_optimizer* optimizer, const char* path) {
  return guarded([&] {
    auto& opt = *need(optimizer, "torchamp_optimizer_load", "optimizer").impl;
    need(path, "torchamp_optimizer_load", "path");
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    opt.load(archive);
  });
}

torchamp_status torchamp_optimizer_master_weight(const torchamp_optimizer* optimizer,
                                                 const torchamp_tensor* param,
                                                 torchamp_tensor** out) {
  return guarded([&] {
    const auto& opt = need(optimizer, "torchamp_optimizer_master_weight", "optimizer");
    const auto& p = tensor_of(&need(param, "torchamp_optimizer_master_weight", "param"));
    need(out, "torchamp_optimizer_master_weight", "out");
    at::Tensor master = opt.master_weight(p);
    *out = master.defined() ? new_handle(std::move(master)) : nullptr;
  });
}

// ---- scalers ----

void torchamp_scaler_options_default(torchamp_scaler_options* options) {
  if (options == nullptr) {
    return;
  }
  const torchamp::GradScalerOptions d;
  *options = torchamp_scaler_options{d.init_scale(),
                                     d.growth_factor(),
                                     d.backoff_factor(),
                                     d.growth_interval(),
                                     d.backoff_interval(),
                                     d.min_scale(),
                                     d.max_consecutive_skips(),
                                     d.enabled() ? 1 : 0,
                                     d.dynamic() ? 1 : 0,
                                     d.unscale_float16() ? 1 : 0,
                                     0};
}

torchamp_status torchamp_paddle_options_default(torchamp_paddle_options* options) {
  return guarded([&] {
    need(options, "torchamp_paddle_options_default", "options");
    *options = paddle_defaults();
  });
}

torchamp_status torchamp_scaler_new(const torchamp_scaler_options* options, torchamp_scaler** out) {
  return make_into(out, "torchamp_scaler_new", [&] {
    torchamp_scaler_options o;
    torchamp_scaler_options_default(&o);
    if (options != nullptr) {
      o = *options;
    }
    auto handle = std::make_unique<torchamp_scaler>();
    handle->core =
        std::make_unique<torchamp::GradScaler>(torchamp::GradScalerOptions()
                                                   .init_scale(o.init_scale)
                                                   .growth_factor(o.growth_factor)
                                                   .backoff_factor(o.backoff_factor)
                                                   .growth_interval(o.growth_interval)
                                                   .backoff_interval(o.backoff_interval)
                                                   .min_scale(o.min_scale)
                                                   .max_consecutive_skips(o.max_consecutive_skips)
                                                   .enabled(o.enabled != 0)
                                                   .dynamic(o.dynamic != 0)
                                                   .unscale_float16(o.unscale_float16 != 0));
    return handle;
  });
}

torchamp_status torchamp_paddle_scaler_new(const torchamp_paddle_options* options,
                                           torchamp_scaler** out) {
  return make_into(out, "torchamp_paddle_scaler_new", [&] {
    const torchamp_paddle_options o = options != nullptr ? *options : paddle_defaults();
    auto handle = std::make_unique<torchamp_scaler>();
    handle->paddle = std::make_unique<torchamp::paddle::GradScaler>(
        o.enable != 0, o.init_loss_scaling, o.incr_ratio, o.decr_ratio, o.incr_every_n_steps,
        o.decr_every_n_nan_or_inf, o.use_dynamic_loss_scaling != 0);
    return handle;
  });
}

void torchamp_scaler_free(torchamp_scaler* scaler) {
  delete scaler;
}

torchamp_status torchamp_scaler_scale(torchamp_scaler* scaler, const torchamp_tensor* output,
                                      torchamp_tensor** out) {
  return guarded([&] {
    auto& s = need(scaler, "torchamp_scaler_scale", "scaler");
    const auto& t = tensor_of(&need(output, "torchamp_scaler_scale", "output"));
    need(out, "torchamp_scaler_scale", "out");
    at::Tensor scaled = s.visit([&](auto& sc) { return sc.scale(t); });
    *out = new_handle(std::move(scaled));
  });
}

torchamp_status torchamp_scaler_unscale_(torchamp_scaler* scaler, torchamp_optimizer* optimizer) {
  return guarded([&] {
    auto& s = need(scaler, "torchamp_scaler_unscale_", "scaler");
    auto& opt = *need(optimizer, "torchamp_scaler_unscale_", "optimizer").impl;
    s.visit([&](auto& sc) { sc.unscale_(opt); });
  });
}

torchamp_status torchamp_scaler_clip_grad_norm_(torchamp_scaler* scaler,
                                                torchamp_optimizer* optimizer, double max_norm,
                                                double* norm) {
  return guarded([&] {
    auto& s = need(scaler, "torchamp_scaler_clip_grad_norm_", "scaler");
    auto& opt = *need(optimizer, "torchamp_scaler_clip_grad_norm_", "optimizer").impl;
    TORCH_CHECK_TYPE(s.core != nullptr,
                     "torchamp_scaler_clip_grad_norm_: a Paddle scaler has no clip_grad_norm_");
    const double n = s.core->clip_grad_norm_(opt, max_norm);
    if (norm != nullptr) {
      *norm = n;
    }
  });
}

torchamp_status torchamp_scaler_step(torchamp_scaler* scaler, torchamp_optimizer* optimizer,
                                     int32_t* stepped) {
  return guarded([&] {
    auto& s = need(scaler, "torchamp_scaler_step", "scaler");
    auto& opt = *need(optimizer, "torchamp_scaler_step", "optimizer").impl;
    const bool did = s.visit([&](auto& sc) { return sc.step(opt).has_value(); });
    if (stepped != nullptr) {
      *stepped = did ? 1 : 0;
    }
  });
}

torchamp_status torchamp_scaler_update(torchamp_scaler* scaler) {
  return guarded([&] {
    need(scaler, "torchamp_scaler_update", "scaler").visit([](auto& sc) { sc.update(); });
  });
}

torchamp_status torchamp_scaler_update_to(torchamp_scaler* scaler, double new_scale) {
  return guarded([&] {
    auto& s = need(scaler, "torchamp_scaler_update_to", "scaler");
    TORCH_CHECK_TYPE(s.core != nullptr,
                     "torchamp_scaler_update_to: a Paddle scaler's update takes no scale");
    s.core->update(new_scale);
  });
}

torchamp_status torchamp_scaler_get_scale(const torchamp_scaler* scaler, double* scale) {
  return guarded([&] {
    const auto& s = need(scaler, "torchamp_scaler_get_scale", "scaler");
    need(scale, "torchamp_scaler_get_scale", "scale");
    *scale = s.visit([](const auto& sc) { return sc.get_scale(); });
  });
}

torchamp_status torchamp_scaler_state_dict(const torchamp_scaler* scaler, torchamp_state** out) {
  return make_into(out, "torchamp_scaler_state_dict", [&] {
    const auto& s = need(scaler, "torchamp_scaler_state_dict", "scaler");
    const torchamp::StateDict dict = s.visit([](const auto& sc) { return sc.state_dict(); });
    auto state = std::make_unique<torchamp_state>();
    state->keys.reserve(dict.size());  // entries point into keys: no reallocation
    for (const auto& item : dict) {
      const c10::IValue& v = item.value();
      torchamp_entry e{nullptr, 0, 0, 0.0, 0};
      if (v.isDouble()) {
        e.kind = TORCHAMP_KIND_DOUBLE;
        e.f = v.toDouble();
      } else if (v.isBool()) {
        e.kind = TORCHAMP_KIND_BOOL;
        e.i = v.toBool() ? 1 : 0;
      } else if (v.isInt()) {
        e.kind = TORCHAMP_KIND_INT;
        e.i = v.toInt();
      } else if (v.isTensor() && v.toTensor().numel() == 1) {  // Paddle's scale
        e.kind = TORCHAMP_KIND_DOUBLE;
        e.f = v.toTensor().item<double>();
      } else {
        TORCH_CHECK(false, "torchamp_scaler_state_dict: key '", item.key().toStringRef(),
                    "' holds a ", v.tagKind(), ", which has no flat form");
      }
      state->keys.push_back(item.key().toStringRef());
      e.key = state->keys.back().c_str();
      state->entries.push_back(e);
    }
    return state;
  });
}

torchamp_status torchamp_scaler_load_state_dict(torchamp_scaler* scaler,
                                                const torchamp_entry* entries, size_t count) {
  return guarded([&] {
    auto& s = need(scaler, "torchamp_scaler_load_state_dict", "scaler");
    TORCH_CHECK_TYPE(entries != nullptr || count == 0,
                     "torchamp_scaler_load_state_dict: entries is NULL");
    torchamp::StateDict dict = empty_state();
    for (size_t i = 0; i < count; ++i) {
      const torchamp_entry& e = entries[i];
      TORCH_CHECK_TYPE(e.key != nullptr, "torchamp_scaler_load_state_dict: entries[", i,
                       "].key is NULL");
      switch (e.kind) {
        case TORCHAMP_KIND_DOUBLE:
          dict.insert_or_assign(e.key, e.f);
          break;
        case TORCHAMP_KIND_INT:
          dict.insert_or_assign(e.key, e.i);
          break;
        case TORCHAMP_KIND_BOOL:
          TORCH_CHECK_VALUE(e.i == 0 || e.i == 1, "torchamp_scaler_load_state_dict: entries[", i,
                            "] ('", e.key, "') is a bool of value ", e.i, ": expected 0 or 1");
          dict.insert_or_assign(e.key, e.i != 0);
          break;
        default:
          TORCH_CHECK_VALUE(false, "torchamp_scaler_load_state_dict: entries[", i, "] ('", e.key,
                            "') has kind ", e.kind,
                            ": expected TORCHAMP_KIND_DOUBLE (1), _INT (2) or _BOOL (3)");
      }
    }
    s.visit([&](auto& sc) { sc.load_state_dict(dict); });
  });
}

torchamp_status torchamp_scaler_save(const torchamp_scaler* scaler, const char* path) {
  return guarded([&] {
    const auto& s = need(scaler, "torchamp_scaler_save", "scaler");
    need(path, "torchamp_scaler_save", "path");
    const std::vector<char> bytes =
        torch::pickle_save(s.visit([](const auto& sc) { return sc.state_dict(); }));
    // Beside it first, then renamed over it: a failed save leaves the file as it was.
    const std::string partial = std::string(path) + ".partial";
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    TORCH_CHECK(file, "torchamp_scaler_save: cannot open '", partial, "' for writing");
    file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    file.close();
    if (!file || std::rename(partial.c_str(), path) != 0) {
      std::remove(partial.c_str());
      TORCH_CHECK(false, "torchamp_scaler_save: writing '", path, "' failed");
    }
  });
}

torchamp_status torchamp_scaler_load(torchamp_scaler* scaler, const char* path) {
  return guarded([&] {
    auto& s = need(scaler, "torchamp_scaler_load", "scaler");
    need(path, "torchamp_scaler_load", "path");
    const c10::IValue value = torch::pickle_load(read_file("torchamp_scaler_load", path));
    TORCH_CHECK_VALUE(value.isGenericDict(), "torchamp_scaler_load: '", path, "' holds a ",
                      value.tagKind(), ", not a state dict");
    s.visit([&](auto& sc) { sc.load_state_dict(value.toGenericDict()); });
  });
}

// ---- autocast ----

torchamp_status torchamp_autocast_enter(int32_t device_type, int32_t dtype, int32_t enabled,
                                        torchamp_autocast** out) {
  return make_into(out, "torchamp_autocast_enter", [&] {
    TORCH_CHECK_VALUE(device_type == TORCHAMP_DEVICE_CPU || device_type == TORCHAMP_DEVICE_CUDA,
                      "torchamp_autocast_enter: device_type must be TORCHAMP_DEVICE_CPU (0) or "
                      "TORCHAMP_DEVICE_CUDA (1), got ",
                      device_type);
    TORCH_CHECK_VALUE(dtype == TORCHAMP_DTYPE_DEFAULT ||
                          (dtype >= 0 && dtype < static_cast<int32_t>(c10::ScalarType::NumOptions)),
                      "torchamp_autocast_enter: dtype must be TORCHAMP_DTYPE_DEFAULT (-1) or a "
                      "c10::ScalarType, got ",
                      dtype);
    const auto device = static_cast<c10::DeviceType>(device_type);
    std::optional<at::ScalarType> type;
    if (dtype != TORCHAMP_DTYPE_DEFAULT) {
      type = static_cast<at::ScalarType>(dtype);
    }
    return std::make_unique<torchamp_autocast>(device, type, enabled != 0);
  });
}

torchamp_status torchamp_autocast_exit(torchamp_autocast* guard) {
  return guarded([&] { need(guard, "torchamp_autocast_exit", "guard").guard.exit(); });
}

void torchamp_autocast_free(torchamp_autocast* guard) {
  delete guard;
}

}  // extern "C"
