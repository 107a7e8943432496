// The __global__ wrappers of the attention kernel bodies and their launches; included only by
// the per-head-dimension instance files.
#pragma once

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/check.h"

namespace dhp::cuda::attn {

template <int HD, bool TC, class T>
__global__ void __launch_bounds__(kThreads) forward_kernel(FwdParams<T> p) {
  extern __shared__ __align__(16) float smem[];  // 16: the staged tiles take cp.async pieces
  forward_block<HD, TC>(p, smem);
}

template <int HD, bool TC, class T>
__global__ void __launch_bounds__(kThreads) backward_kv_kernel(BwdParams<T> p) {
  extern __shared__ __align__(16) float smem[];
  backward_kv_block<HD, TC>(p, smem);
}

template <int HD, bool TC, class T>
__global__ void __launch_bounds__(kThreads) backward_q_kernel(BwdParams<T> p) {
  extern __shared__ __align__(16) float smem[];
  backward_q_block<HD, TC>(p, smem);
}

inline unsigned tiles_of(int64_t T) { return unsigned((T + kTile - 1) / kTile); }

// Dynamic shared memory past the 48 KiB default needs the kernel's consent; asked on every
// launch because it is a cheap attribute write and keeps no state here.
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  DHP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int HD, bool TC, class T>
void launch_forward(cudaStream_t stream, const FwdParams<T>& p) {
  const size_t bytes = sizeof(float) * size_t(forward_smem_floats(HD, TC, int(sizeof(T))));
  allow_smem(forward_kernel<HD, TC, T>, bytes);
  forward_kernel<HD, TC, T><<<dim3(tiles_of(p.Tq), unsigned(p.Hq)), kThreads, bytes, stream>>>(p);
  DHP_CUDA_CHECK_LAUNCH();
}

template <int HD, bool TC, class T>
void launch_backward(cudaStream_t stream, const BwdParams<T>& p) {
  constexpr int kElem = int(sizeof(T));
  const size_t kv_bytes = sizeof(float) * size_t(backward_kv_smem_floats(HD, TC, kElem));
  allow_smem(backward_kv_kernel<HD, TC, T>, kv_bytes);
  if (p.Tk > 0) {
    backward_kv_kernel<HD, TC, T>
        <<<dim3(tiles_of(p.Tk), unsigned(p.Hkv)), kThreads, kv_bytes, stream>>>(p);
    DHP_CUDA_CHECK_LAUNCH();
  }
  const size_t q_bytes = sizeof(float) * size_t(backward_q_smem_floats(HD, TC, kElem));
  allow_smem(backward_q_kernel<HD, TC, T>, q_bytes);
  if (p.Tq > 0) {
    backward_q_kernel<HD, TC, T>
        <<<dim3(tiles_of(p.Tq), unsigned(p.Hq)), kThreads, q_bytes, stream>>>(p);
    DHP_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace dhp::cuda::attn
