// Compiled (not built) by style/check_nodiscard.cmake: each line marked
// "discarded" must draw a warning, the others none. A temporary guard dies
// at its semicolon and would autocast nothing.
#include <torchamp/autocast.h>

void probe(c10::Device device, bool use_amp) {
  torchamp::autocast(c10::DeviceType::CPU, at::kBFloat16);  // discarded
  torchamp::autocast(device, use_amp);                      // discarded
  torchamp::autocast(device, at::kBFloat16, use_amp);       // discarded
#ifndef __clang__
  // clang parses this line as a declaration of c10::kCPU (an error, not a
  // silent temporary); GCC as an expression.
  torchamp::autocast(c10::kCPU);  // discarded
#endif
  torchamp::autocast guard(device, use_amp);
  guard.exit();
}
