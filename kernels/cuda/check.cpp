#include "kernels/cuda/check.h"

#include <cudnn_graph.h>
#include <fmt/format.h>

#include "core/check.h"
#include "kernels/cuda/cublaslt_lib.h"

namespace dhp::cuda {

static_assert(CUBLAS_STATUS_SUCCESS == 0, "DHP_CUBLAS_CHECK compares with 0");
static_assert(CUDNN_STATUS_SUCCESS == 0, "DHP_CUDNN_CHECK compares with 0");

void fail_cuda(cudaError_t err, const char* call, const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);
  throw Error(fmt::format("CUDA error {} ({}) in {} at {}:{} on device {}", int(err),
                          cudaGetErrorString(err), call, file, line, device));
}

void fail_cublas(int status, const char* call, const char* file, int line) {
  int device = -1;
  cudaGetDevice(&device);
  throw Error(fmt::format("cuBLAS error {} ({}) in {} at {}:{} on device {}", status,
                          cublaslt().status_string(cublasStatus_t(status)), call, file, line,
                          device));
}

void fail_cudnn(int status, const char* call, const char* file, int line) {
  // cuDNN keeps the reason of its last failure; it names the attribute or the engine.
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  throw Error(fmt::format("cuDNN error {} ({}) in {} at {}:{}{}{}", status,
                          cudnnGetErrorString(cudnnStatus_t(status)), call, file, line,
                          detail[0] ? ": " : "", detail));
}

}  // namespace dhp::cuda
