// The attention kernels for head dimension 128: fp32 storage with fp32 or TF32
// tensor-core products, and bf16 storage with tensor-core products.
#include "kernels/cuda/attention_launch.cuh"

namespace dhp::cuda::attn {
template void launch_forward<128, false>(cudaStream_t, const FwdParams<float>&);
template void launch_forward<128, true>(cudaStream_t, const FwdParams<float>&);
template void launch_forward<128, true>(cudaStream_t, const FwdParams<bf16>&);
template void launch_backward<128, false>(cudaStream_t, const BwdParams<float>&);
template void launch_backward<128, true>(cudaStream_t, const BwdParams<float>&);
template void launch_backward<128, true>(cudaStream_t, const BwdParams<bf16>&);
}  // namespace dhp::cuda::attn
