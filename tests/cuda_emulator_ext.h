// What the non-attention kernels (kernels/cuda/*_kernels.cuh) need of the thread emulator
// beyond tests/cuda_emulator.h, built on it: 2-D blocks (threadIdx.y) and blockDim, block-wide
// votes (__syncthreads_or), warp ballots (__ballot_sync, __popc), and float4. Include it after
// every other header and before the kernel headers, and launch through emu::launch_dims (it
// sets blockDim; emu::launch alone does not).
#pragma once

#include <bit>
#include <cstdint>
#include <functional>

#include "tests/cuda_emulator.h"

namespace dhp::emu {

inline Dim3& block_dim() {
  static Dim3 d;
  return d;
}

// CUDA numbers the threads of a block x fastest, then y, then z; warps are runs of 32 in that
// order. The base emulator runs threads by that linear number (its thread_idx.x).
inline Dim3 thread_index() {
  const unsigned t = machine().thread_idx.x;
  const Dim3& b = block_dim();
  return Dim3{t % b.x, t / b.x % b.y, t / (b.x * b.y)};
}

// Runs body(shared memory) for every thread of a grid (x, y) of blocks of shape `block`.
inline void launch_dims(Dim3 grid, Dim3 block, size_t smem_floats,
                        const std::function<void(float*)>& body) {
  block_dim() = block;
  launch(grid, int(block.x * block.y * block.z), smem_floats, body);
}

// Shared memory for an object of type T, in floats.
template <class T>
constexpr size_t floats_for() {
  return (sizeof(T) + sizeof(float) - 1) / sizeof(float);
}

// The lanes of the current thread's warp: [first, last).
inline void warp_of(size_t me, size_t& first, size_t& last) {
  first = me - me % 32;
  last = std::min(machine().slots.size(), first + 32);
}

// __syncthreads_or: a barrier that also returns whether any thread of the block passed a
// nonzero predicate. Every thread posts its predicate, then reads all of them between two
// barriers, so no thread overwrites its slot (in a later shuffle) before all have read it.
inline int sync_threads_or(int pred) {
  Machine& m = machine();
  m.slots[size_t(m.current)] = pred != 0;
  sync_threads();
  int any = 0;
  for (uint64_t s : m.slots) any |= s != 0;
  sync_threads();
  return any;
}

// __ballot_sync over the full warp: bit i set when lane i passed a nonzero predicate.
inline unsigned ballot(int pred) {
  Machine& m = machine();
  const size_t me = size_t(m.current);
  m.slots[me] = pred != 0;
  yield(Stop::shuffle);  // every lane has posted its predicate
  size_t first = 0, last = 0;
  warp_of(me, first, last);
  unsigned bits = 0;
  for (size_t t = first; t < last; ++t)
    if (m.slots[t]) bits |= 1u << (t - first);
  yield(Stop::shuffle);  // every lane has read, so the table can be reused
  return bits;
}

}  // namespace dhp::emu

// CUDA's float4 and its constructor function; 16-byte aligned as on the device.
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

// threadIdx replaces the base emulator's 1-D one; the others are undefined first in case the
// base emulator comes to define them too (launch_dims is what sets blockDim here).
#undef threadIdx
#undef blockDim
#undef __syncthreads_or
#undef __ballot_sync
#undef __popc
#define threadIdx (::dhp::emu::thread_index())
#define blockDim (::dhp::emu::block_dim())
#define __syncthreads_or(pred) ::dhp::emu::sync_threads_or(pred)
#define __ballot_sync(mask, pred) ::dhp::emu::ballot(pred)
#define __popc(x) std::popcount(unsigned(x))
