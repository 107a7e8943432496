// Warp and block reductions shared by the kernels of this folder, and the launch shapes of
// their launchers. The order of every sum is a function of the block size only, so results
// are the same bits on every run. Compiles under nvcc and, with tests/cuda_emulator_ext.h
// defining CUDA's keywords and built-ins, as plain C++ (no CUDA header is included here).
#pragma once

namespace dhp::cuda {

constexpr int kWarp = 32;

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <class T>
__device__ inline T warp_max(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32 and at
// most 1024; `shared` holds 32 values. Callable repeatedly (it synchronises before reuse).
template <class T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

// A launch's grid and block. Computed by one function per launch, which the launcher and the
// emulated tests (tests/test_cuda_kernels_emulated.cpp) both call.
struct LaunchDims {
  unsigned grid_x = 1, grid_y = 1;
  unsigned block_x = 1, block_y = 1;
#ifdef __CUDACC__
  dim3 grid() const { return dim3(grid_x, grid_y); }
  dim3 block() const { return dim3(block_x, block_y); }
#endif
};

// Blocks for n items at `per_block` items each, capped so grid-stride loops cover the rest.
inline unsigned blocks_for(long long n, int per_block, long long cap = 65535LL * 16) {
  long long b = (n + per_block - 1) / per_block;
  if (b < 1) b = 1;
  return unsigned(b < cap ? b : cap);
}

// A 1-D grid-stride launch over n items, `threads` per block.
inline LaunchDims grid_stride(long long n, int threads) {
  return LaunchDims{blocks_for(n, threads), 1, unsigned(threads), 1};
}

// One block of `threads` per row.
inline LaunchDims block_per_row(long long rows, int threads) {
  return LaunchDims{unsigned(rows), 1, unsigned(threads), 1};
}

// Whether every pointer is 16-byte aligned, so float4 loads and stores are legal.
inline bool aligned16(const void* a, const void* b = nullptr, const void* c = nullptr,
                      const void* d = nullptr) {
  auto ok = [](const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15u) == 0; };
  return ok(a) && ok(b) && ok(c) && ok(d);
}

}  // namespace dhp::cuda
