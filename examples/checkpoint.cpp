// GradScaler checkpoints between C++ and Python:
//   checkpoint FROM_PYTHON TO_PYTHON
// reads a state dict Python wrote with torch.save(scaler.state_dict(), path),
// loads it, and writes one Python reads with scaler.load_state_dict(torch.load(path)).
#include <torch/serialize.h>
#include <torchamp/grad_scaler.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: checkpoint FROM_PYTHON TO_PYTHON\n";
    return 2;
  }
  torchamp::GradScaler scaler;

  // Python -> C++: torch::pickle_load reads what torch.save wrote.
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  scaler.load_state_dict(torch::pickle_load(bytes).toGenericDict());
  std::cout << "loaded scale " << scaler.get_scale() << " growth_interval "
            << scaler.get_growth_interval() << "\n";

  // C++ -> Python: torch::pickle_save writes what torch.load reads.
  const std::vector<char> out = torch::pickle_save(scaler.state_dict());
  std::ofstream(argv[2], std::ios::binary)
      .write(out.data(), static_cast<std::streamsize>(out.size()));
}
