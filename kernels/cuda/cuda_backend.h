// The CUDA backend: device memory through cudaMalloc, every transfer and op ordered on one
// non-blocking stream the backend owns, and the op interface implemented by the kernels of
// this folder (CudaOps, cuda_ops.h). Only the dhp executable, the CUDA tests and the CUDA
// benches link it.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace dhp {

class CudaOps;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& opt);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::CUDA; }
  const Ops& ops() const override;

  void* allocate(size_t bytes) override;
  void deallocate(void* p) override;
  // Plain pageable copies: cudaMemcpyAsync from pageable memory returns once the source has
  // been staged, so callers may reuse their host vectors at once, and the transfers here
  // (batches, checkpoints) are small or rare beside the step's compute.
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void zero(void* dst, size_t bytes) override;
  void synchronize() override;

  std::vector<AttnTiming> take_attention_timings() override;
  void agree_attention(const std::vector<AttnTiming>& everyone) override;

  cudaStream_t stream() const { return stream_; }
  void* stream_handle() const override { return stream_; }
  int ordinal() const { return device_; }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaOps> ops_;
};

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt);
// Adds "cuda" to the registry, with a probe that tells "auto" whether a device is usable.
void register_cuda_backend(BackendRegistry& registry);

}  // namespace dhp
