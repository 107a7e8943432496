// The attention kernels for head dimension 64.
#include "kernels/cuda/attention_launch.cuh"

namespace dhp::cuda::attn {
template void launch_forward<64>(cudaStream_t, const FwdParams&);
template void launch_backward<64>(cudaStream_t, const BwdParams&);
}  // namespace dhp::cuda::attn
