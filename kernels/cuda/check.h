// The CUDA member of the check-macro family (kernels/check.h): reports the failed call, its
// error string, file:line and the current device as a dhp::Error. The message is built in
// check.cpp: fmt's headers do not compile under nvcc in C++20 mode, so .cu files include
// nothing of fmt.
#pragma once

#include <cuda_runtime.h>

namespace dhp::cuda {
[[noreturn]] void fail_cuda(cudaError_t err, const char* call, const char* file, int line);
// `status` is a cublasStatus_t; taken as int so that kernels need no cuBLAS header.
[[noreturn]] void fail_cublas(int status, const char* call, const char* file, int line);
// `status` is a cudnnStatus_t, for the same reason.
[[noreturn]] void fail_cudnn(int status, const char* call, const char* file, int line);
}  // namespace dhp::cuda

#define DHP_CUDA_CHECK(call)                                                   \
  do {                                                                         \
    const cudaError_t dhp_err_ = (call);                                       \
    if (dhp_err_ != cudaSuccess) ::dhp::cuda::fail_cuda(dhp_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: launch errors surface here, not at the next unrelated call.
#define DHP_CUDA_CHECK_LAUNCH() DHP_CUDA_CHECK(cudaGetLastError())

// cuBLAS / cuBLASLt calls (CUBLAS_STATUS_SUCCESS is 0).
#define DHP_CUBLAS_CHECK(call)                                                 \
  do {                                                                         \
    const int dhp_st_ = int(call);                                             \
    if (dhp_st_ != 0) ::dhp::cuda::fail_cublas(dhp_st_, #call, __FILE__, __LINE__); \
  } while (0)

// cuDNN calls (CUDNN_STATUS_SUCCESS is 0).
#define DHP_CUDNN_CHECK(call)                                                  \
  do {                                                                         \
    const int dhp_st_ = int(call);                                             \
    if (dhp_st_ != 0) ::dhp::cuda::fail_cudnn(dhp_st_, #call, __FILE__, __LINE__); \
  } while (0)
