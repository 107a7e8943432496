// The attention kernels for head dimension 128.
#include "kernels/cuda/attention_launch.cuh"

namespace dhp::cuda::attn {
template void launch_forward<128>(cudaStream_t, const FwdParams&);
template void launch_backward<128>(cudaStream_t, const BwdParams&);
}  // namespace dhp::cuda::attn
