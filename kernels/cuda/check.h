// The CUDA member of the check-macro family (kernels/check.h): reports the failed call, its
// error string, file:line and the current device. The format string is fmt::runtime because
// nvcc cannot evaluate fmt's compile-time format checks.
#pragma once

#include <cuda_runtime.h>

#include "kernels/check.h"

#define DHP_CUDA_CHECK(call)                                                              \
  do {                                                                                    \
    cudaError_t dhp_err_ = (call);                                                        \
    if (dhp_err_ != cudaSuccess) {                                                        \
      int dhp_dev_ = -1;                                                                  \
      cudaGetDevice(&dhp_dev_);                                                           \
      throw ::dhp::Error(fmt::format(fmt::runtime("CUDA error {} ({}) in {} at {}:{} on device {}"), \
                                     int(dhp_err_), cudaGetErrorString(dhp_err_), #call,  \
                                     __FILE__, __LINE__, dhp_dev_));                      \
    }                                                                                     \
  } while (0)

// After every kernel launch: launch errors surface here, not at the next unrelated call.
#define DHP_CUDA_CHECK_LAUNCH() DHP_CUDA_CHECK(cudaGetLastError())
