#include "kernels/cuda/cuda_backend.h"

#include <fmt/format.h>

#include "core/check.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"

namespace dhp {

CudaBackend::CudaBackend(const BackendOptions& opt) : device_(opt.device) {
  const CudaStatus st = cuda_status();
  DHP_CHECK(st.devices > 0, "device \"cuda\": no usable CUDA device ({})", st.reason);
  DHP_CHECK(device_ >= 0 && device_ < st.devices,
            "device \"cuda\": device ordinal {} is out of range (this machine has {})", device_,
            st.devices);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  DHP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  ops_ = std::make_unique<CudaOps>(*this, stream_, opt.precision, opt.attention);
}

CudaBackend::~CudaBackend() {
  // The ops' buffers go back to this backend, so they are released while it is whole.
  ops_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

const Ops& CudaBackend::ops() const { return *ops_; }

std::vector<AttnTiming> CudaBackend::take_attention_timings() { return ops_->take_attention_timings(); }

void CudaBackend::agree_attention(const std::vector<AttnTiming>& everyone) {
  ops_->agree_attention(everyone);
}

void* CudaBackend::allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for later calls
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    throw Error(fmt::format("out of device memory on cuda:{} allocating {:.1f} MiB ({:.1f} of "
                            "{:.1f} GiB free): {}",
                            device_, double(bytes) / (1 << 20), double(free_bytes) / (1 << 30),
                            double(total) / (1 << 30), cudaGetErrorString(err)));
  }
  ++allocations_;
  return p;
}

void CudaBackend::deallocate(void* p) {
  // cudaFree waits for the device; a failure here (in a destructor) is not worth a throw.
  if (p) cudaFree(p);
}

void CudaBackend::upload(void* dst, const void* src, size_t bytes) {
  if (bytes) DHP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::download(void* dst, const void* src, size_t bytes) {
  if (bytes) DHP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  DHP_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes) DHP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::zero(void* dst, size_t bytes) {
  if (bytes) DHP_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaBackend::synchronize() { DHP_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt) {
  return std::make_unique<CudaBackend>(opt);
}

void register_cuda_backend(BackendRegistry& registry) {
  registry.add("cuda", make_cuda_backend, [] {
    const CudaStatus st = cuda_status();
    return st.devices > 0 ? std::string() : fmt::format("no usable device: {}", st.reason);
  }, [](int ordinal) {
    cudaDeviceProp prop{};
    return cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess ? std::string(prop.name) : std::string();
  });
}

}  // namespace dhp
