// Which CUDA devices this process can use. A machine with the toolkit but no driver (or no
// GPU) reports zero devices and a reason instead of failing, so the CPU backend takes over.
#pragma once

#include <string>

namespace dhp {

struct CudaStatus {
  int devices = 0;
  std::string reason;  // why there are none, e.g. "no CUDA driver (cudaErrorInsufficientDriver)"
  std::string name;    // device 0's name when there is one
};

CudaStatus cuda_status();

}  // namespace dhp
