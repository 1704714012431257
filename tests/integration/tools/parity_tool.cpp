// Replays tests/integration/python/test_parity.py's random sequences through
// torchamp::GradScaler and an SGD that runs Python's torch.optim.SGD
// operations (see PythonSGD), or torchamp's fused AdamW on ATen's path
// (against Python's AdamW(fused=True)), and writes the trace
// after every step (scale, growth tracker, skip decisions, gradients,
// parameters) for the Python side to compare with PyTorch's GradScaler:
// twice, the scaler's state on the host and in tensors.
//
//   parity_tool SPEC.pt OUT.pt
//
// SPEC is torch.save({"sequences": [...]}) (see make_sequence there); OUT is
// torch::pickle_save({"host_state": [trace, ...], "device_state": [...]}),
// which torch.load reads; a sequence's trace is {"steps": [{scale,
// growth_tracker, stepped}, ...]} and its tensors packed (see Packed).
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include <ATen/ScalarOps.h>
#include <ATen/core/grad_mode.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

const IValue& at_key(const Dict& d, const char* key) {
  auto it = d.find(IValue(std::string(key)));
  TORCH_CHECK(it != d.end(), "parity spec: missing key ", key);
  return it->value();
}

// Elements by index: a range-for over a c10::List yields proxies, which GCC
// 12 and 14 warn about one way (-Wrange-loop-construct) or the other
// (-Wdangling-reference).
std::vector<IValue> items(const IValue& list) {
  const List l = list.toList();
  std::vector<IValue> out;
  out.reserve(l.size());
  for (size_t k = 0; k < l.size(); ++k) {
    out.push_back(l.get(k));
  }
  return out;
}

double num(const IValue& v) {
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

// A Python float as Python's argument parser passes it to a Tensor op: a
// wrapped-number 0-dim double tensor. On a bfloat16 tensor, `t.mul_(0.9)` in
// C++ (the Scalar overload) first rounds 0.9 to bfloat16; Python's
// `t.mul_(0.9)` multiplies by 0.9 in float32 and rounds once.
at::Tensor py_float(double v) {
  at::Tensor t = c10::scalar_to_tensor(at::Scalar(v));
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// torch.optim.SGD's single-tensor step (what PyTorch runs on CPU tensors), op
// for op, so that parameters can be compared bit for bit and any difference
// is the scaler's. LibTorch's own C++ SGD is not that on bfloat16 parameters:
// its momentum update `buf.mul_(momentum)` rounds the momentum to bfloat16
// first (see py_float; found by this test).
class PythonSGD : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;

  at::Tensor step(LossClosure closure = nullptr) override {
    TORCH_CHECK(!closure, "PythonSGD: no closure");
    at::NoGradGuard no_grad;
    for (auto& group : param_groups()) {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
      for (auto& param : group.params()) {
        if (!param.grad().defined()) {
          continue;
        }
        at::Tensor grad = param.grad();
        if (o.weight_decay() != 0) {
          grad = grad.add(param, o.weight_decay());
        }
        if (o.momentum() != 0) {
          auto it = buffers_.find(param.unsafeGetTensorImpl());
          if (it == buffers_.end()) {
            it = buffers_.emplace(param.unsafeGetTensorImpl(), grad.detach().clone()).first;
          } else {
            it->second.mul_(py_float(o.momentum())).add_(grad, 1 - o.dampening());
          }
          grad = o.nesterov() ? grad.add(it->second, o.momentum()) : it->second;
        }
        param.add_(grad, -o.lr());
      }
    }
    return {};
  }

 private:
  std::unordered_map<const void*, at::Tensor> buffers_;
};

Dict new_dict() {
  return Dict(c10::StringType::get(), c10::AnyType::get());
}

List new_list() {
  return List(c10::AnyType::get());
}

// A sequence's gradients and parameters after each of its steps, packed
// for the Python side to compare fast (test_parity.py's Packed builds the
// same from PyTorch's): the elements of every float32 tensor in one tensor,
// of every bfloat16 one in another, in the order they come (each step's
// gradients, then its parameters, optimizer by optimizer), and their layout
// as text: "f3x5 " a float32 3 x 5 tensor, "b7 " a bfloat16 one of 7
// elements, "- " an absent gradient, "g "/"p " where a step's gradients /
// parameters start.
struct Packed {
  std::string layout;
  std::vector<at::Tensor> float32, bfloat16;

  void add(const std::vector<std::vector<at::Tensor>>& params, bool grads) {
    layout += grads ? "g " : "p ";
    for (const auto& group : params) {
      for (const auto& p : group) {
        const at::Tensor t = grads ? p.grad() : p;
        if (!t.defined()) {
          layout += "- ";
          continue;
        }
        const bool bf16 = t.scalar_type() == at::kBFloat16;
        TORCH_CHECK(bf16 || t.scalar_type() == at::kFloat, "parity: a ", t.scalar_type(),
                    " tensor");
        layout += bf16 ? 'b' : 'f';
        for (int64_t d = 0; d < t.dim(); ++d) {
          layout += (d == 0 ? "" : "x") + std::to_string(t.size(d));
        }
        layout += ' ';
        (bf16 ? bfloat16 : float32).push_back(t.detach().reshape({-1}).clone());
      }
    }
  }

  static at::Tensor joined(const std::vector<at::Tensor>& parts, at::ScalarType dtype) {
    return parts.empty() ? at::empty({0}, dtype) : at::cat(parts);
  }

  void into(Dict& out) const {
    out.insert("layout", layout);
    out.insert("float32", joined(float32, at::kFloat));
    out.insert("bfloat16", joined(bfloat16, at::kBFloat16));
  }
};

Dict run(const Dict& seq, bool device_state) {
  const Dict cfg = at_key(seq, "cfg").toGenericDict();
  torchamp::GradScaler scaler(torchamp::GradScalerOptions()
                                  .device_state(device_state)
                                  .init_scale(num(at_key(cfg, "init_scale")))
                                  .growth_factor(num(at_key(cfg, "growth_factor")))
                                  .backoff_factor(num(at_key(cfg, "backoff_factor")))
                                  .growth_interval(at_key(cfg, "growth_interval").toInt()));
  const List opt_cfgs = at_key(seq, "opts").toList();
  const List init = at_key(seq, "params").toList();
  std::vector<std::vector<at::Tensor>> params;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> opts;
  for (size_t o = 0; o < init.size(); ++o) {
    std::vector<at::Tensor> group;
    for (const IValue& p : items(init.get(o))) {
      group.push_back(p.toTensor().clone().set_requires_grad(true));
    }
    const Dict oc = opt_cfgs.get(o).toGenericDict();
    const std::string kind = at_key(oc, "kind").toStringRef();
    // Python's fused=True ones: torchamp's on ATen's path (_fused_adamw_,
    // _fused_adam_, _fused_sgd_ with the scaler's flag and scale, as Python's).
    const auto aten = torchamp::optim::FusedOptions().aten_kernels(true);
    if (kind == "adamw_fused" || kind == "adam_fused") {
      const List betas = at_key(oc, "betas").toList();
      const std::tuple<double, double> b{num(betas.get(0)), num(betas.get(1))};
      const double lr = num(at_key(oc, "lr")), decay = num(at_key(oc, "weight_decay"));
      const bool amsgrad = at_key(oc, "amsgrad").toBool();
      if (kind == "adamw_fused") {
        opts.push_back(std::make_unique<torchamp::optim::AdamW>(
            group, torch::optim::AdamWOptions(lr).betas(b).weight_decay(decay).amsgrad(amsgrad),
            aten));
      } else {
        opts.push_back(std::make_unique<torchamp::optim::Adam>(
            group, torch::optim::AdamOptions(lr).betas(b).weight_decay(decay).amsgrad(amsgrad),
            aten));
      }
    } else {
      const auto sgd = torch::optim::SGDOptions(num(at_key(oc, "lr")))
                           .momentum(num(at_key(oc, "momentum")))
                           .dampening(num(at_key(oc, "dampening")))
                           .weight_decay(num(at_key(oc, "weight_decay")))
                           .nesterov(at_key(oc, "nesterov").toBool());
      if (kind == "sgd_fused") {
        opts.push_back(std::make_unique<torchamp::optim::SGD>(group, sgd, aten));
      } else {
        opts.push_back(std::make_unique<PythonSGD>(group, sgd));
      }
    }
    params.push_back(std::move(group));
  }

  List steps = new_list();
  Packed packed;
  for (const IValue& step_v : items(at_key(seq, "steps"))) {
    const Dict step = step_v.toGenericDict();
    const List grads = at_key(step, "grads").toList();
    for (size_t o = 0; o < params.size(); ++o) {
      const List g = grads.get(o).toList();
      for (size_t j = 0; j < params[o].size(); ++j) {
        params[o][j].mutable_grad() =
            g.get(j).isNone() ? at::Tensor() : scaler.scale(g.get(j).toTensor());
      }
    }
    for (const IValue& i : items(at_key(step, "unscale"))) {
      scaler.unscale_(*opts[i.toInt()]);
    }
    List stepped = new_list();
    for (const IValue& i : items(at_key(step, "step"))) {
      stepped.push_back(scaler.step(*opts[i.toInt()]).has_value());
    }
    packed.add(params, /*grads=*/true);
    const IValue& new_scale = at_key(step, "new_scale");
    if (new_scale.isNone()) {
      scaler.update();
    } else {
      scaler.update(num(new_scale));
    }
    if (at_key(step, "reload").toBool()) {
      torchamp::GradScaler fresh(torchamp::GradScalerOptions().device_state(device_state));
      fresh.load_state_dict(scaler.state_dict());
      scaler = std::move(fresh);
    }
    Dict rec = new_dict();
    rec.insert("scale", scaler.get_scale());
    rec.insert("growth_tracker", scaler.get_growth_tracker());
    rec.insert("stepped", stepped);
    packed.add(params, /*grads=*/false);
    steps.push_back(rec);
  }
  Dict trace = new_dict();
  trace.insert("steps", steps);
  packed.into(trace);
  return trace;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: parity_tool SPEC.pt OUT.pt\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  const Dict spec = torch::pickle_load(bytes).toGenericDict();
  // Once with the scaler's state on the host, once in tensors
  // (GradScalerOptions().device_state): the path a CUDA scaler takes, with
  // ATen's own AMP ops as Python's.
  Dict out = new_dict();
  for (const bool device_state : {false, true}) {
    List traces = new_list();
    for (const IValue& seq : items(at_key(spec, "sequences"))) {
      traces.push_back(run(seq.toGenericDict(), device_state));
    }
    out.insert(device_state ? "device_state" : "host_state", traces);
  }
  const std::vector<char> data = torch::pickle_save(out);
  std::ofstream(argv[2], std::ios::binary)
      .write(data.data(), static_cast<std::streamsize>(data.size()));
  return 0;
}
