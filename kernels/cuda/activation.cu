#include "kernels/cuda/launch.h"
#include "kernels/cuda/activation_kernels.cuh"
#include "kernels/cuda/check.h"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void swiglu_forward_kernel(S* h, const S* a, const S* b, int64_t n) {
  act::swiglu_forward_block(h, a, b, n);
}

template <class S>
__global__ void swiglu_backward_kernel(S* da, S* db, const S* dh, const S* a,
                                       const S* b, int64_t n) {
  act::swiglu_backward_block(da, db, dh, a, b, n);
}

template <class S>
__global__ void gelu_forward_kernel(S* y, const S* x, int64_t n, GeluKind k) {
  act::gelu_forward_block(y, x, n, k);
}

template <class S>
__global__ void gelu_backward_kernel(S* dx, const S* dy, const S* x, int64_t n, GeluKind k) {
  act::gelu_backward_block(dx, dy, x, n, k);
}

}  // namespace

template <class S>
void swiglu_forward(cudaStream_t stream, S* h, const S* a, const S* b, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  swiglu_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(h, a, b, n);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void swiglu_backward(cudaStream_t stream, S* da, S* db, const S* dh, const S* a,
                     const S* b, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  swiglu_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(da, db, dh, a, b, n);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void gelu_forward(cudaStream_t stream, S* y, const S* x, int64_t n, GeluKind k) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  gelu_forward_kernel<<<l.grid(), l.block(), 0, stream>>>(y, x, n, k);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void gelu_backward(cudaStream_t stream, S* dx, const S* dy, const S* x, int64_t n, GeluKind k) {
  if (n <= 0) return;
  const LaunchDims l = act::launch(n);
  gelu_backward_kernel<<<l.grid(), l.block(), 0, stream>>>(dx, dy, x, n, k);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_ACTIVATION_INSTANCES(S)                                                       \
  template void swiglu_forward<S>(cudaStream_t, S*, const S*, const S*, int64_t);          \
  template void swiglu_backward<S>(cudaStream_t, S*, S*, const S*, const S*, const S*,     \
                                   int64_t);                                               \
  template void gelu_forward<S>(cudaStream_t, S*, const S*, int64_t, GeluKind);            \
  template void gelu_backward<S>(cudaStream_t, S*, const S*, const S*, int64_t, GeluKind);
DHP_ACTIVATION_INSTANCES(float)
DHP_ACTIVATION_INSTANCES(bf16)
#undef DHP_ACTIVATION_INSTANCES

}  // namespace dhp::cuda
