#include "compat/capture.h"

#if TORCHAMP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cuda_runtime_api.h>
#endif

namespace torchamp {
namespace compat {

bool capturing(c10::Device device) {
#if TORCHAMP_WITH_CUDA
  if (!device.is_cuda()) {
    return false;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()), &status));
  return status != cudaStreamCaptureStatusNone;
#else
  (void)device;
  return false;
#endif
}

}  // namespace compat
}  // namespace torchamp
