// Launches of the CUDA attention kernels for one head dimension; each supported head
// dimension is instantiated in its own file (kernels/cuda/instances/) to keep compiles short.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/attention_kernels.cuh"

namespace dhp::cuda::attn {

// TC: the tensor-core (TF32) variant. T: the storage of the head vectors; bf16 storage comes
// with tensor-core products only (its values are exact in TF32).
template <int HD, bool TC, class T>
void launch_forward(cudaStream_t stream, const FwdParams<T>& p);

// Both backward kernels: dK and dV per key tile, then dQ per query tile.
template <int HD, bool TC, class T>
void launch_backward(cudaStream_t stream, const BwdParams<T>& p);

#define DHP_ATTENTION_INSTANCE(HD)                                                            \
  extern template void launch_forward<HD, false>(cudaStream_t, const FwdParams<float>&);      \
  extern template void launch_forward<HD, true>(cudaStream_t, const FwdParams<float>&);       \
  extern template void launch_forward<HD, true>(cudaStream_t, const FwdParams<bf16>&);        \
  extern template void launch_backward<HD, false>(cudaStream_t, const BwdParams<float>&);     \
  extern template void launch_backward<HD, true>(cudaStream_t, const BwdParams<float>&);      \
  extern template void launch_backward<HD, true>(cudaStream_t, const BwdParams<bf16>&);
DHP_ATTENTION_INSTANCE(16)
DHP_ATTENTION_INSTANCE(32)
DHP_ATTENTION_INSTANCE(64)
DHP_ATTENTION_INSTANCE(80)
DHP_ATTENTION_INSTANCE(96)
DHP_ATTENTION_INSTANCE(128)
#undef DHP_ATTENTION_INSTANCE

}  // namespace dhp::cuda::attn
