// The parent project's program: torchamp from its subproject, used as usual.
#include <torchamp/torchamp.h>

#include <ATen/ops/ones.h>

#include <iostream>

int main() {
  torchamp::GradScaler scaler(torchamp::GradScalerOptions().init_scale(8));
  const at::Tensor scaled = scaler.scale(at::ones({2}));
  std::cout << "torchamp " << TORCHAMP_VERSION << " as a subproject: scaled "
            << scaled[0].item<float>() << "\n";
  return scaled[0].item<float>() == 8.0f ? 0 : 1;
}
