// The attention kernels for head dimension 96.
#include "kernels/cuda/attention_launch.cuh"

namespace dhp::cuda::attn {
template void launch_forward<96>(cudaStream_t, const FwdParams&);
template void launch_backward<96>(cudaStream_t, const BwdParams&);
}  // namespace dhp::cuda::attn
