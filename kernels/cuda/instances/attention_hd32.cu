// The attention kernels for head dimension 32.
#include "kernels/cuda/attention_launch.cuh"

namespace dhp::cuda::attn {
template void launch_forward<32>(cudaStream_t, const FwdParams&);
template void launch_backward<32>(cudaStream_t, const BwdParams&);
}  // namespace dhp::cuda::attn
