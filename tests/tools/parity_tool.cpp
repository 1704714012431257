// Replays tests/python/test_parity.py's random sequences through
// torchamp::GradScaler and LibTorch's torch::optim::SGD, and writes the trace
// after every step (scale, growth tracker, skip decisions, gradients,
// parameters) for the Python side to compare with PyTorch's GradScaler.
//
//   parity_tool SPEC.pt OUT.pt
//
// SPEC is torch.save({"sequences": [...]}) (see make_sequence there); OUT is
// torch::pickle_save({"traces": [[step, ...], ...]}), which torch.load reads.
#include <torchamp/grad_scaler.h>

#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
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

double num(const IValue& v) {
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
}

Dict new_dict() {
  return Dict(c10::StringType::get(), c10::AnyType::get());
}

List new_list() {
  return List(c10::AnyType::get());
}

// Grads or params of every optimizer, cloned; an absent grad is None.
List snapshot(const std::vector<std::vector<at::Tensor>>& params, bool grads) {
  List out = new_list();
  for (const auto& group : params) {
    List g = new_list();
    for (const auto& p : group) {
      if (grads) {
        g.push_back(p.grad().defined() ? IValue(p.grad().detach().clone()) : IValue());
      } else {
        g.push_back(p.detach().clone());
      }
    }
    out.push_back(g);
  }
  return out;
}

List run(const Dict& seq) {
  const Dict cfg = at_key(seq, "cfg").toGenericDict();
  torchamp::GradScaler scaler(torchamp::GradScalerOptions()
                                  .init_scale(num(at_key(cfg, "init_scale")))
                                  .growth_factor(num(at_key(cfg, "growth_factor")))
                                  .backoff_factor(num(at_key(cfg, "backoff_factor")))
                                  .growth_interval(at_key(cfg, "growth_interval").toInt()));
  const List opt_cfgs = at_key(seq, "opts").toList();
  const List init = at_key(seq, "params").toList();
  std::vector<std::vector<at::Tensor>> params;
  std::vector<std::unique_ptr<torch::optim::SGD>> opts;
  for (size_t o = 0; o < init.size(); ++o) {
    std::vector<at::Tensor> group;
    for (const IValue& p : init.get(o).toList()) {
      group.push_back(p.toTensor().clone().set_requires_grad(true));
    }
    const Dict oc = opt_cfgs.get(o).toGenericDict();
    opts.push_back(std::make_unique<torch::optim::SGD>(
        group, torch::optim::SGDOptions(num(at_key(oc, "lr")))
                   .momentum(num(at_key(oc, "momentum")))
                   .dampening(num(at_key(oc, "dampening")))
                   .weight_decay(num(at_key(oc, "weight_decay")))
                   .nesterov(at_key(oc, "nesterov").toBool())));
    params.push_back(std::move(group));
  }

  List trace = new_list();
  for (const IValue& step_v : at_key(seq, "steps").toList()) {
    const Dict step = step_v.toGenericDict();
    const List grads = at_key(step, "grads").toList();
    for (size_t o = 0; o < params.size(); ++o) {
      const List g = grads.get(o).toList();
      for (size_t j = 0; j < params[o].size(); ++j) {
        params[o][j].mutable_grad() =
            g.get(j).isNone() ? at::Tensor() : scaler.scale(g.get(j).toTensor());
      }
    }
    for (const IValue& i : at_key(step, "unscale").toList()) {
      scaler.unscale_(*opts[i.toInt()]);
    }
    List stepped = new_list();
    for (const IValue& i : at_key(step, "step").toList()) {
      stepped.push_back(scaler.step(*opts[i.toInt()]).has_value());
    }
    List grads_after = snapshot(params, /*grads=*/true);
    const IValue& new_scale = at_key(step, "new_scale");
    if (new_scale.isNone()) {
      scaler.update();
    } else {
      scaler.update(num(new_scale));
    }
    if (at_key(step, "reload").toBool()) {
      torchamp::GradScaler fresh;
      fresh.load_state_dict(scaler.state_dict());
      scaler = std::move(fresh);
    }
    Dict rec = new_dict();
    rec.insert("scale", scaler.get_scale());
    rec.insert("growth_tracker", scaler.get_growth_tracker());
    rec.insert("stepped", stepped);
    rec.insert("grads", grads_after);
    rec.insert("params", snapshot(params, /*grads=*/false));
    trace.push_back(rec);
  }
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
  List traces = new_list();
  for (const IValue& seq : at_key(spec, "sequences").toList()) {
    traces.push_back(run(seq.toGenericDict()));
  }
  Dict out = new_dict();
  out.insert("traces", traces);
  const std::vector<char> data = torch::pickle_save(out);
  std::ofstream(argv[2], std::ios::binary)
      .write(data.data(), static_cast<std::streamsize>(data.size()));
  return 0;
}
