// Asynchronous global -> shared copies (cp.async, sm_80 and later): a tile for the next step
// of a kernel's loop is in flight while the current one computes. Outside nvcc (the thread
// emulator of the tests) and on older devices the copy is an ordinary one and the waits are
// nothing, so kernel bodies keep one code path.
#pragma once

#include <cstdint>
#include <cstring>

namespace dhp::cuda {

#if defined(__CUDACC__)
// 16 bytes from global src to shared dst, both 16-byte aligned; bypasses L1 (.cg): a tile is
// read once per block.
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
#else
  *static_cast<int4*>(dst) = *static_cast<const int4*>(src);
#endif
}
// Closes the group of copies this thread issued since the last commit.
__device__ __forceinline__ void async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are in flight. Other threads' copies
// are visible after a __syncthreads that follows every thread's wait.
template <int N>
__device__ __forceinline__ void async_wait() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
#else
inline void copy16_async(void* dst, const void* src) { std::memcpy(dst, src, 16); }
inline void async_commit() {}
template <int N>
inline void async_wait() {}
#endif

}  // namespace dhp::cuda
