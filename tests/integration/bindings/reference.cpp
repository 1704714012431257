// The trace every binding test must print, written with torchamp's C++ API:
// the quickstart (examples/quickstart.cpp) on the CPU, a run that overflows
// (skipped steps, backoff, growth), a state-dict round trip, and four bad
// inputs with their typed messages. Floats are printed as their bits.
//
//   binding_reference            the trace, on stdout
//   binding_reference CHECK DIR  loads DIR/scaler.pt and DIR/optimizer.pt
//                                (written through the C ABI) and checks them
//                                against the same run's state
#include <torchamp/autocast.h>
#include <torchamp/grad_scaler.h>
#include <torchamp/optim.h>

#include <torch/nn/functional/linear.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/utils.h>
#include <torch/version.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}

void print_step(const char* what, int i, float loss, double scale, bool stepped) {
  std::printf("%s %d loss %08" PRIx32 " scale %016" PRIx64 " stepped %d\n", what, i, bits(loss),
              bits(scale), stepped ? 1 : 0);
}

void print_state(const char* prefix, const torchamp::StateDict& state) {
  for (const auto& item : state) {
    const c10::IValue& v = item.value();
    const std::string key = item.key().toStringRef();
    if (v.isDouble()) {
      std::printf("%s %s 1 %016" PRIx64 "\n", prefix, key.c_str(), bits(v.toDouble()));
    } else if (v.isBool()) {
      std::printf("%s %s 3 %d\n", prefix, key.c_str(), v.toBool() ? 1 : 0);
    } else {
      std::printf("%s %s 2 %" PRId64 "\n", prefix, key.c_str(), v.toInt());
    }
  }
}

bool same(const torchamp::StateDict& a, const torchamp::StateDict& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (const auto& item : a) {
    if (!b.contains(item.key()) || b.at(item.key()) != item.value()) {
      return false;
    }
  }
  return true;
}

// The C ABI's status for a C++ error (include/torchamp/c/torchamp.h).
template <class F>
void print_error(const char* name, F&& call, const torchamp::GradScaler& scaler) {
  const torchamp::StateDict before = scaler.state_dict();
  int status = 0;
  std::string message;
  try {
    call();
  } catch (const c10::ValueError& e) {
    status = 2;
    message = e.what_without_backtrace();
  } catch (const c10::Error& e) {
    status = 1;
    message = e.what_without_backtrace();
  }
  std::printf("error %s %d %s\n", name, status, message.c_str());
  std::printf("unchanged %d\n", same(before, scaler.state_dict()) ? 1 : 0);
}

struct Run {
  torch::nn::Linear model{4, 1};
  // The optimizer torchamp_sgd_new makes: torchamp's fused SGD. (LibTorch's
  // SGD rounds p - lr * g once where ATen has FMA, torchamp's kernel twice:
  // 1 ulp apart now and then, as docs/optimizers.md says.)
  torchamp::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.01)};
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  torchamp::GradScaler overflow{
      torchamp::GradScalerOptions().init_scale(std::ldexp(1.0, 127)).growth_interval(2)};

  Run() {
    for (int i = 0; i < 3; ++i) {  // x before y (function arguments have no order)
      auto x = torch::randn({8, 4});
      data.emplace_back(x, torch::randn({8, 1}));
    }
  }

  // One iteration of the quickstart's loop.
  void iterate(const char* what, int i, torchamp::GradScaler& scaler) {
    auto& [x, y] = data[i % data.size()];
    optimizer.zero_grad();
    torchamp::autocast guard(torch::kCPU);
    auto out = model->forward(x);
    guard.exit();
    auto loss = torch::nn::functional::mse_loss(out.to(torch::kFloat), y);
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(optimizer).has_value();
    scaler.update();
    print_step(what, i, loss.item<float>(), scaler.get_scale(), stepped);
  }

  void trace() {
    std::printf("run quickstart\n");
    torchamp::GradScaler scaler;
    for (int i = 0; i < 3; ++i) {
      iterate("step", i, scaler);
    }
    auto& [x, y] = data[0];
    optimizer.zero_grad();
    scaler.scale(torch::nn::functional::mse_loss(model->forward(x), y)).backward();
    scaler.unscale_(optimizer);
    const double norm = torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    const bool stepped = scaler.step(optimizer).has_value();
    scaler.update();
    std::printf("clip norm %016" PRIx64 " scale %016" PRIx64 " stepped %d\n", bits(norm),
                bits(scaler.get_scale()), stepped ? 1 : 0);

    std::printf("run overflow\n");
    for (int i = 0; i < 6; ++i) {
      iterate("step", i, overflow);
    }
    print_state("state", overflow.state_dict());
    torchamp::GradScaler loaded;
    loaded.load_state_dict(overflow.state_dict());
    print_state("loaded", loaded.state_dict());
  }

  void errors() {
    std::printf("errors\n");
    std::printf("error null_handle 3 torchamp_scaler_step: scaler is NULL\n");

    torchamp::GradScaler fresh;
    auto half = torch::full({1, 2}, 1.0, torch::kHalf).requires_grad_();
    half.mutable_grad() = torch::full({1, 2}, 1.0, torch::kHalf);
    torch::optim::SGD half_optimizer({half}, torch::optim::SGDOptions(0.01));
    print_error(
        "float16_gradient", [&] { fresh.unscale_(half_optimizer); }, fresh);

    auto& [x, y] = data[0];
    optimizer.zero_grad();
    overflow.scale(torch::nn::functional::mse_loss(model->forward(x), y)).backward();
    (void)overflow.step(optimizer);
    print_error(
        "step_twice", [&] { (void)overflow.step(optimizer); }, overflow);
    overflow.update();

    torchamp::StateDict garbled = overflow.state_dict();
    garbled.insert_or_assign("scale", -1.0);
    print_error(
        "garbled_state", [&] { overflow.load_state_dict(garbled); }, overflow);
    print_state("final", overflow.state_dict());
  }
};

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

int main(int argc, char** argv) {
  torch::manual_seed(0);
  Run run;
  if (argc == 3 && std::string(argv[1]) == "CHECK") {
    const std::string dir = argv[2];
    std::freopen("/dev/null", "w", stdout);
    run.trace();
    run.errors();
    // The scaler, as Python's torch.load would read it.
    torchamp::GradScaler scaler;
    scaler.load_state_dict(torch::pickle_load(read_bytes(dir + "/scaler.pt")).toGenericDict());
    // The optimizer, in LibTorch's format, into a C++ one of the same type.
    torch::nn::Linear twin(4, 1);
    torchamp::optim::SGD optimizer(twin->parameters(), torch::optim::SGDOptions(0.5));
    torch::load(optimizer, dir + "/optimizer.pt");
    const double lr = optimizer.param_groups()[0].options().get_lr();
    // LibTorch 1.13's load restores the state only, not the groups' options.
    const bool lr_loaded = TORCH_VERSION_MAJOR < 2 || lr == 0.01;
    const bool ok = same(scaler.state_dict(), run.overflow.state_dict()) && lr_loaded;
    std::fprintf(stderr, "%s: scaler %s, optimizer lr %g\n", ok ? "ok" : "MISMATCH",
                 same(scaler.state_dict(), run.overflow.state_dict()) ? "equal" : "differs", lr);
    return ok ? 0 : 1;
  }
  run.trace();
  run.errors();
  return 0;
}
