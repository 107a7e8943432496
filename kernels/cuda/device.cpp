#include <fmt/format.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"

namespace dhp {

CudaStatus cuda_status() {
  CudaStatus s;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // cudaErrorInsufficientDriver (35) and cudaErrorNoDevice (100) are normal on CPU machines.
    s.reason = fmt::format("{} ({})", cudaGetErrorString(err), cudaGetErrorName(err));
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return s;
  }
  s.devices = n;
  if (n > 0) {
    cudaDeviceProp prop{};
    DHP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    s.name = fmt::format("{} (sm_{}{}, {:.0f} GiB)", prop.name, prop.major, prop.minor,
                         double(prop.totalGlobalMem) / (1ull << 30));
  } else {
    s.reason = "no CUDA device";
  }
  return s;
}

}  // namespace dhp
