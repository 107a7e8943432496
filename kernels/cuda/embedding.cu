#include "kernels/cuda/check.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/reduce.cuh"

namespace dhp::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_forward_kernel(float* out, const int32_t* ids, const float* table,
                                         int64_t C) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  float* o = out + t * C;
  const float* row = id < 0 ? nullptr : table + int64_t(id) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = row ? row[c] : 0.0f;
}

// One block per token row t. Only the block of an id's first occurrence does work: it owns
// that table row, so it can add the matching rows one after another without atomics. Matches
// are found a tile of blockDim rows at a time and compacted in row order with warp ballots.
__global__ void embedding_backward_kernel(float* dtable, const float* dout, const int32_t* ids,
                                          int64_t T, int64_t C) {
  __shared__ int64_t match[kThreads];
  __shared__ int warp_count[kThreads / kWarp];
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0) return;
  int earlier = 0;
  for (int64_t u = threadIdx.x; u < t; u += blockDim.x) earlier |= ids[u] == id;
  if (__syncthreads_or(earlier)) return;

  float* d = dtable + int64_t(id) * C;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int64_t base = t; base < T; base += blockDim.x) {
    const int64_t u = base + threadIdx.x;
    const bool hit = u < T && ids[u] == id;
    const unsigned ballot = __ballot_sync(0xffffffffu, hit);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < int(blockDim.x / kWarp); ++w) {
      if (w < warp) offset += warp_count[w];
      total += warp_count[w];
    }
    if (hit) match[offset + __popc(ballot & ((1u << lane) - 1u))] = u;
    __syncthreads();
    for (int k = 0; k < total; ++k) {
      const float* src = dout + match[k] * C;
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] += src[c];
    }
    __syncthreads();
  }
}

}  // namespace

void embedding_forward(cudaStream_t stream, float* out, const int32_t* ids, const float* table,
                       int64_t T, int64_t C) {
  if (T <= 0) return;
  embedding_forward_kernel<<<unsigned(T), kThreads, 0, stream>>>(out, ids, table, C);
  DHP_CUDA_CHECK_LAUNCH();
}

void embedding_backward(cudaStream_t stream, float* dtable, const float* dout, const int32_t* ids,
                        int64_t T, int64_t C) {
  if (T <= 0) return;
  embedding_backward_kernel<<<unsigned(T), kThreads, 0, stream>>>(dtable, dout, ids, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
