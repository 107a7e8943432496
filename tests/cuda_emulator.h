// Runs the bodies of CUDA kernels on the CPU, so their indexing and synchronisation are tested
// on machines without a GPU. Include this before the kernel header: it defines the CUDA
// keywords and built-ins the bodies use (threadIdx, blockIdx, gridDim, __syncthreads,
// __shfl_xor_sync).
//
// The threads of a block are fibers (ucontext) run one after another, in thread order, from
// one barrier to the next; blocks run one after another. A missing barrier therefore shows up
// deterministically: a thread reads shared memory that a later thread has not written yet, or
// that an earlier one has already overwritten for the next step. Shared memory starts as NaN
// in every block, so reading what nobody wrote poisons the result. A shuffle is a barrier
// around an exchange through a table, which is exact as long as every thread of the block
// reaches it (the kernels promise that). A barrier reached by only some threads (some
// returned) is reported as an error.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <vector>

namespace dhp::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct Machine {
  Dim3 thread_idx, block_idx, grid_dim;
  ucontext_t main{};
  std::vector<ucontext_t> ctx;
  std::vector<std::vector<char>> stacks;
  std::vector<uint64_t> slots;  // one shuffle value per thread
  std::vector<char> done;
  int current = 0;
  const std::function<void(float*)>* body = nullptr;
  float* smem = nullptr;
};

inline Machine& machine() {
  static Machine m;
  return m;
}

// swapcontext returns twice; kept out of line so that no caller's locals live across it.
[[gnu::noinline]] inline void switch_context(ucontext_t* from, const ucontext_t* to) {
  swapcontext(from, to);
}

inline void sync_threads() {
  Machine& m = machine();
  switch_context(&m.ctx[size_t(m.current)], &m.main);
}

template <class T>
T shfl_xor(T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  Machine& m = machine();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  m.slots[size_t(m.current)] = bits;
  sync_threads();
  bits = m.slots[size_t(m.current ^ lane_mask)];
  sync_threads();
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

inline void fiber_entry();

// A fiber that runs fiber_entry on `stack` and then continues `link`. Out of line like
// switch_context: getcontext returns twice as well.
[[gnu::noinline]] inline void make_fiber(ucontext_t* c, std::vector<char>& stack, ucontext_t* link) {
  getcontext(c);
  c->uc_stack.ss_sp = stack.data();
  c->uc_stack.ss_size = stack.size();
  c->uc_link = link;
  makecontext(c, fiber_entry, 0);
}

inline void fiber_entry() {
  Machine& m = machine();
  (*m.body)(m.smem);
  m.done[size_t(m.current)] = 1;
}

// Runs body(shared memory) for every thread of every block of the grid (x, y).
inline void launch(Dim3 grid, int threads, size_t smem_floats,
                   const std::function<void(float*)>& body) {
  constexpr size_t kStack = size_t(256) << 10;
  Machine& m = machine();
  m.body = &body;
  m.grid_dim = grid;
  m.ctx.assign(size_t(threads), ucontext_t{});
  m.stacks.resize(size_t(threads));
  for (auto& s : m.stacks) s.resize(kStack);
  m.slots.assign(size_t(threads), 0);
  std::vector<float> smem(smem_floats);
  m.smem = smem.data();
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::fill(smem.begin(), smem.end(), std::numeric_limits<float>::quiet_NaN());
      m.block_idx = {bx, by, 0};
      m.done.assign(size_t(threads), 0);
      for (int t = 0; t < threads; ++t) {
        make_fiber(&m.ctx[size_t(t)], m.stacks[size_t(t)], &m.main);
      }
      for (;;) {
        for (int t = 0; t < threads; ++t) {
          if (m.done[size_t(t)]) continue;
          m.current = t;
          m.thread_idx = {unsigned(t), 0, 0};
          switch_context(&m.main, &m.ctx[size_t(t)]);
        }
        int finished = 0;
        for (char d : m.done) finished += d;
        if (finished == threads) break;
        if (finished > 0)
          throw std::logic_error("emulated kernel: a barrier that only some threads reach");
      }
    }
}

}  // namespace dhp::emu

#define __device__
#define __host__
#define __forceinline__ inline
#define threadIdx (::dhp::emu::machine().thread_idx)
#define blockIdx (::dhp::emu::machine().block_idx)
#define gridDim (::dhp::emu::machine().grid_dim)
#define __syncthreads() ::dhp::emu::sync_threads()
#define __shfl_xor_sync(mask, v, lane_mask, ...) ::dhp::emu::shfl_xor(v, lane_mask)
