// Drives checkpoint tests that need separate processes or Python:
//
//   checkpoint_tool write-state PATH      a core scaler with non-default values in
//                                         every field -> torch::pickle_save(state_dict)
//   checkpoint_tool read-state PATH       torch::pickle_load -> load_state_dict ->
//                                         prints the scaler's values, one per line
//   checkpoint_tool write-all-state PATH  every core key at a non-default value
//                                         -> torch::pickle_save(state_dict)
//   checkpoint_tool write-paddle-state PATH / read-paddle-state PATH
//                                         the same with the Paddle facade (every
//                                         Paddle key non-default)
//   checkpoint_tool train OUT [--stop-at K --save DIR] [--resume DIR]
//                                         a 10-step training run with overflows at fixed
//                                         steps; writes the final parameters, scale and
//                                         trackers to OUT as raw bytes
#include <torchamp/grad_scaler.h>
#include <torchamp/paddle.h>

#include "state_dicts.h"

#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <string>

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("cannot read " + path);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    throw std::runtime_error("cannot write " + path);
  }
}

void print(const torchamp::GradScaler& s) {
  std::cout.precision(17);
  std::cout << "scale " << s.get_scale() << "\n"
            << "growth_factor " << s.get_growth_factor() << "\n"
            << "backoff_factor " << s.get_backoff_factor() << "\n"
            << "growth_interval " << s.get_growth_interval() << "\n"
            << "growth_tracker " << s.get_growth_tracker() << "\n"
            << "backoff_interval " << s.get_backoff_interval() << "\n"
            << "backoff_tracker " << s.get_backoff_tracker() << "\n"
            << "dynamic " << s.is_dynamic() << "\n"
            << "min_scale " << s.get_min_scale() << "\n"
            << "max_consecutive_skips " << s.get_max_consecutive_skips() << "\n"
            << "consecutive_skips " << s.get_consecutive_skips() << "\n"
            << "init_scale " << s.options().init_scale() << "\n";
}

void print(const torchamp::paddle::GradScaler& s) {
  std::cout.precision(17);
  std::cout << "scale " << s.get_scale() << "\n"
            << "init_loss_scaling " << s.get_init_loss_scaling() << "\n"
            << "incr_ratio " << s.get_incr_ratio() << "\n"
            << "decr_ratio " << s.get_decr_ratio() << "\n"
            << "incr_every_n_steps " << s.get_incr_every_n_steps() << "\n"
            << "decr_every_n_nan_or_inf " << s.get_decr_every_n_nan_or_inf() << "\n"
            << "incr_count " << s.get_incr_count() << "\n"
            << "decr_count " << s.get_decr_count() << "\n"
            << "use_dynamic_loss_scaling " << s.is_use_dynamic_loss_scaling() << "\n";
}

// Every key of the core schema, none at its default.
int write_all_state(const std::string& path) {
  const auto d = torchamp_test::core_dict();
  torchamp::GradScaler s;
  s.load_state_dict(d);
  write_file(path, torch::pickle_save(s.state_dict()));
  print(s);
  return 0;
}

// Every key of Paddle's schema, none at its default.
int write_paddle_state(const std::string& path) {
  torchamp::paddle::GradScaler s;
  s.load_state_dict(torchamp_test::paddle_dict());
  write_file(path, torch::pickle_save(s.state_dict()));
  print(s);
  return 0;
}

int read_paddle_state(const std::string& path) {
  torchamp::paddle::GradScaler s;
  s.load_state_dict(torch::pickle_load(read_file(path)).toGenericDict());
  print(s);
  return 0;
}

int write_state(const std::string& path) {
  torchamp::GradScaler s(torchamp::GradScalerOptions()
                             .init_scale(1024)
                             .growth_factor(3.0)
                             .backoff_factor(0.25)
                             .growth_interval(7));
  // Three clean steps: growth tracker 3.
  auto p = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD opt({p}, 0.1);
  for (int i = 0; i < 3; ++i) {
    p.mutable_grad() = torch::ones({1});
    s.step(opt);
    s.update();
  }
  write_file(path, torch::pickle_save(s.state_dict()));
  print(s);
  return 0;
}

int read_state(const std::string& path) {
  torchamp::GradScaler s;
  s.load_state_dict(torch::pickle_load(read_file(path)).toGenericDict());
  print(s);
  return 0;
}

// ---- exact resume -----------------------------------------------------------

constexpr int kSteps = 10;
bool overflow_at(int step) {
  return step == 1 || step == 3 || step == 4 || step == 7;
}

int train(const std::string& out, int stop_at, const std::string& save_dir,
          const std::string& resume_dir) {
  torch::manual_seed(42);
  torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                              torch::nn::Linear(16, 4));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
  torchamp::GradScaler scaler(
      torchamp::GradScalerOptions().init_scale(1024).growth_interval(2).backoff_interval(2));
  int first = 0;
  if (!resume_dir.empty()) {
    // A fresh process with default-constructed scaler options: everything
    // that matters must come from the files.
    scaler = torchamp::GradScaler();
    torch::load(model, resume_dir + "/model.pt");
    torch::load(opt, resume_dir + "/optimizer.pt");
    torch::load(scaler, resume_dir + "/scaler.pt");
    first = static_cast<int>(read_file(resume_dir + "/step").size());
  }
  for (int step = first; step < kSteps; ++step) {
    if (step == stop_at) {
      torch::save(model, save_dir + "/model.pt");
      torch::save(opt, save_dir + "/optimizer.pt");
      torch::save(scaler, save_dir + "/scaler.pt");
      write_file(save_dir + "/step", std::vector<char>(static_cast<size_t>(step), 's'));
      return 0;
    }
    torch::manual_seed(1000 + step);  // the data of a step does not depend on the process
    auto x = torch::randn({16, 8});
    auto y = torch::randn({16, 4});
    opt.zero_grad();
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    if (overflow_at(step)) {
      model->parameters()[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    }
    scaler.step(opt);
    scaler.update();
  }
  std::vector<char> bytes;
  for (const auto& p : model->parameters()) {
    const auto* data = static_cast<const char*>(p.data_ptr());
    bytes.insert(bytes.end(), data, data + p.nbytes());
  }
  const std::string tail = "scale " + std::to_string(scaler.get_scale()) + " growth " +
                           std::to_string(scaler.get_growth_tracker()) + " backoff " +
                           std::to_string(scaler.get_backoff_tracker()) + "\n";
  bytes.insert(bytes.end(), tail.begin(), tail.end());
  write_file(out, bytes);
  std::cout << tail;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write-state" && argc == 3) {
      return write_state(argv[2]);
    }
    if (cmd == "read-state" && argc == 3) {
      return read_state(argv[2]);
    }
    if (cmd == "write-all-state" && argc == 3) {
      return write_all_state(argv[2]);
    }
    if (cmd == "write-paddle-state" && argc == 3) {
      return write_paddle_state(argv[2]);
    }
    if (cmd == "read-paddle-state" && argc == 3) {
      return read_paddle_state(argv[2]);
    }
    if (cmd == "train" && argc >= 3) {
      int stop_at = -1;
      std::string save_dir, resume_dir;
      for (int a = 3; a + 1 < argc; a += 2) {
        const std::string opt = argv[a];
        if (opt == "--stop-at") {
          stop_at = std::stoi(argv[a + 1]);
        } else if (opt == "--save") {
          save_dir = argv[a + 1];
        } else if (opt == "--resume") {
          resume_dir = argv[a + 1];
        }
      }
      return train(argv[2], stop_at, save_dir, resume_dir);
    }
    std::cerr << "usage: checkpoint_tool write-state|read-state PATH | train OUT [...]\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
