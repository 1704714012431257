// Compiled (not built) by style/check_compile_error.cmake: Python's habit,
// `ddp.forward(x)`, must fail with one error that says what to pass, not a
// cascade from inside std::invoke_result_t.
#include <torchamp/data_parallel.h>

void probe(torchamp::DistributedDataParallel& ddp, const at::Tensor& x) {
  ddp.forward(x);
}
