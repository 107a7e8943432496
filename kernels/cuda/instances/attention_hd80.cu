// The attention kernels for head dimension 80, fp32 and TF32 tensor-core variants.
#include "kernels/cuda/attention_launch.cuh"

namespace dhp::cuda::attn {
template void launch_forward<80, false>(cudaStream_t, const FwdParams&);
template void launch_forward<80, true>(cudaStream_t, const FwdParams&);
template void launch_backward<80, false>(cudaStream_t, const BwdParams&);
template void launch_backward<80, true>(cudaStream_t, const BwdParams&);
}  // namespace dhp::cuda::attn
