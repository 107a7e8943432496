// The dhp executable: everything lives in the libraries; this only hands over the arguments
// and tells the front end about the backends linked into this binary.
#include <fmt/format.h>

#include "app/cli.h"

#ifdef DHP_WITH_CUDA
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "parallel/nccl_comm.h"
#endif

int main(int argc, char** argv) {
  dhp::CliHooks hooks;
#ifdef DHP_WITH_CUDA
  dhp::register_cuda_backend(dhp::backend_registry());
  hooks.cuda_report = [] {
    dhp::CudaStatus s = dhp::cuda_status();
    if (s.devices == 0) return fmt::format("compiled; no usable device: {}", s.reason);
    return fmt::format("compiled; {} device(s), device 0: {}", s.devices, s.name);
  };
  hooks.device_communicator = dhp::make_nccl_world;
#endif
  return dhp::run_cli(argc, argv, hooks);
}
