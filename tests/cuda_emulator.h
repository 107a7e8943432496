// Runs the bodies of CUDA kernels on the CPU, so their indexing and synchronisation are tested
// on machines without a GPU. Include this before the kernel header: it defines the CUDA
// keywords and built-ins the bodies use (threadIdx, blockIdx, gridDim, __syncthreads,
// __syncwarp, __shfl_xor_sync, and the tensor-core instruction of the attention kernels).
//
// The threads of a block are fibers run one after another on one CPU thread. A warp
// runs lane by lane up to its next shuffle, which completes once all its 32 lanes are there;
// it runs on to the next __syncthreads, where it waits while the other warps run: warp after
// warp in ascending order between one barrier and the next, in descending order between that
// one and the one after. So one warp always runs ahead of the others, both ways: a missing
// barrier lets a warp read shared memory that another has not written yet, or overwrite what
// another has yet to read, and the result comes out wrong, deterministically. Shared memory
// starts as NaN in every block, so reading what nobody wrote poisons the result. A barrier or
// shuffle that only some threads reach (others returned or wait elsewhere) is an error.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <vector>

namespace dhp::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

enum class Stop : char { shuffle, barrier, done };

// A fiber's saved state. On x86-64 (without AddressSanitizer) a switch saves the callee-saved
// registers on the fiber's own stack and swaps stack pointers, in a few nanoseconds; glibc's
// swapcontext also saves and restores the signal mask with a system call on every switch,
// which was 95% of the emulated tests' time. Elsewhere, and under ASan (which intercepts
// swapcontext to follow the stacks), ucontext does it.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define DHP_EMU_FAST_SWITCH 1
struct Fiber {
  void* sp = nullptr;
};
// dhp_emu_switch(from, to): pushes rbp, rbx, r12-r15 and the return address onto the current
// stack, stores the stack pointer in from->sp, loads to->sp and pops the same from there. The
// floating-point control words are left alone: no emulated kernel changes them.
extern "C" void dhp_emu_switch(Fiber* from, const Fiber* to);
asm(R"(
  .text
  .p2align 4
  .weak dhp_emu_switch
  .hidden dhp_emu_switch
  .type dhp_emu_switch, @function
dhp_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq (%rsi), %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dhp_emu_switch, .-dhp_emu_switch
)");
#else
struct Fiber {
  ucontext_t ctx{};
};
#endif

struct Machine {
  Dim3 thread_idx, block_idx, grid_dim;
  Fiber main{};
  std::vector<Fiber> ctx;
  // Fiber stacks, never zeroed and never freed: launches of other block sizes reuse them.
  static constexpr size_t kStack = size_t(256) << 10;
  std::vector<std::unique_ptr<char[]>> stacks;
  std::vector<uint64_t> slots;  // one shuffle value per thread
  std::vector<uint32_t> frags;  // six mma operand registers per thread
  std::vector<Stop> stop;       // where each thread stopped last
  int current = 0;
  const std::function<void(float*)>* body = nullptr;
  float* smem = nullptr;
};

inline Machine& machine() {
  static Machine m;
  return m;
}

#if DHP_EMU_FAST_SWITCH
inline void switch_context(Fiber* from, const Fiber* to) { dhp_emu_switch(from, to); }
#else
// swapcontext and getcontext return twice; kept out of line so that no caller's locals live
// across them.
[[gnu::noinline]] inline void switch_context(Fiber* from, const Fiber* to) {
  swapcontext(&from->ctx, &to->ctx);
}
#endif

inline void yield(Stop why) {
  Machine& m = machine();
  m.stop[size_t(m.current)] = why;
  switch_context(&m.ctx[size_t(m.current)], &m.main);
}

inline void sync_threads() { yield(Stop::barrier); }

template <class T>
T shfl_xor(T v, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  Machine& m = machine();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  m.slots[size_t(m.current)] = bits;
  yield(Stop::shuffle);  // every lane has written its value
  bits = m.slots[size_t(m.current ^ lane_mask)];
  yield(Stop::shuffle);  // every lane has read, so the table can be reused
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}

// cvt.rna.tf32.f32: to 10 mantissa bits, to nearest with ties away from zero, in an fp32 bit
// pattern with the low 13 bits clear.
inline uint32_t to_tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;  // not inf or NaN
  return u & 0xffffe000u;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 of the warp, d += a · b, with the PTX
// ISA's fragment layout (lane = 4·g + t): a0 A(g, t), a1 A(g+8, t), a2 A(g, t+4),
// a3 A(g+8, t+4); b0 B(t, g), b1 B(t+4, g); d0 D(g, 2t), d1 D(g, 2t+1), d2 D(g+8, 2t),
// d3 D(g+8, 2t+1).
inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  Machine& m = machine();
  const size_t me = size_t(m.current), base = me - me % 32;
  for (int i = 0; i < 4; ++i) m.frags[6 * me + size_t(i)] = a[i];
  for (int i = 0; i < 2; ++i) m.frags[6 * me + 4 + size_t(i)] = b[i];
  yield(Stop::shuffle);  // every lane has stored its operands
  auto value = [&](size_t lane, int reg) {
    float f;
    std::memcpy(&f, &m.frags[6 * (base + lane) + size_t(reg)], sizeof f);
    return f;
  };
  const int g = int(me % 32) / 4, t = int(me % 32) % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    float acc = d[e];
    for (int k = 0; k < 8; ++k) {
      const float x = value(size_t((row % 8) * 4 + k % 4), (row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0));
      const float y = value(size_t(col * 4 + k % 4), 4 + (k >= 4 ? 1 : 0));
      acc += x * y;
    }
    d[e] = acc;
  }
  yield(Stop::shuffle);  // every lane has read, so the table can be reused
}

inline void fiber_entry() {
  Machine& m = machine();
  (*m.body)(m.smem);
  m.stop[size_t(m.current)] = Stop::done;
}

#if DHP_EMU_FAST_SWITCH
// A finished fiber switches back for good: it has no caller to return to.
[[noreturn]] inline void fiber_start() {
  fiber_entry();
  Machine& m = machine();
  switch_context(&m.ctx[size_t(m.current)], &m.main);
  std::abort();  // never resumed once done
}

// The new stack holds what dhp_emu_switch pops: six zero registers, then fiber_start as the
// return address, placed so that fiber_start begins with the stack aligned as after a call.
inline void make_fiber(Fiber* c, char* stack, Fiber*) {
  auto top = reinterpret_cast<uintptr_t>(stack + Machine::kStack) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<void**>(top - 16);
  *sp = reinterpret_cast<void*>(&fiber_start);
  sp -= 6;
  std::fill(sp, sp + 6, nullptr);
  c->sp = sp;
}
#else
[[gnu::noinline]] inline void make_fiber(Fiber* f, char* stack, Fiber* link) {
  ucontext_t* c = &f->ctx;
  getcontext(c);
  c->uc_stack.ss_sp = stack;
  c->uc_stack.ss_size = Machine::kStack;
  c->uc_link = &link->ctx;
  makecontext(c, fiber_entry, 0);
}
#endif

// Runs the lanes [t0, t1) of one warp to their next barrier (or the end), through any number
// of shuffles; returns where they stopped.
inline Stop run_warp(int t0, int t1) {
  Machine& m = machine();
  for (;;) {
    for (int t = t0; t < t1; ++t) {
      if (m.stop[size_t(t)] == Stop::done) continue;
      m.current = t;
      m.thread_idx = {unsigned(t), 0, 0};
      switch_context(&m.main, &m.ctx[size_t(t)]);
    }
    const Stop first = m.stop[size_t(t0)];
    for (int t = t0; t < t1; ++t)
      if (m.stop[size_t(t)] != first)
        throw std::logic_error("emulated kernel: lanes of a warp stopped at different places");
    if (first != Stop::shuffle) return first;
  }
}

// Runs body(shared memory) for every thread of every block of the grid (x, y).
inline void launch(Dim3 grid, int threads, size_t smem_floats,
                   const std::function<void(float*)>& body) {
  Machine& m = machine();
  m.body = &body;
  m.grid_dim = grid;
  m.ctx.assign(size_t(threads), Fiber{});
  while (m.stacks.size() < size_t(threads))
    m.stacks.push_back(std::unique_ptr<char[]>(new char[Machine::kStack]));
  m.slots.assign(size_t(threads), 0);
  m.frags.assign(6 * size_t(threads), 0);
  const int warps = (threads + 31) / 32;
  std::vector<float> smem(smem_floats);
  m.smem = smem.data();
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::fill(smem.begin(), smem.end(), std::numeric_limits<float>::quiet_NaN());
      m.block_idx = {bx, by, 0};
      m.stop.assign(size_t(threads), Stop::barrier);
      for (int t = 0; t < threads; ++t) make_fiber(&m.ctx[size_t(t)], m.stacks[size_t(t)].get(), &m.main);
      for (int round = 0;; ++round) {
        int finished = 0;
        for (int i = 0; i < warps; ++i) {
          const int w = round % 2 == 0 ? i : warps - 1 - i;
          finished += run_warp(32 * w, std::min(threads, 32 * w + 32)) == Stop::done;
        }
        if (finished == warps) break;
        if (finished > 0)
          throw std::logic_error("emulated kernel: a barrier that only some threads reach");
      }
    }
}

}  // namespace dhp::emu

#define DHP_EMULATED_CUDA 1  // kernels/cuda/storage.cuh: bf16 without the CUDA headers
#define __device__
#define __host__
#define __forceinline__ inline
#define threadIdx (::dhp::emu::machine().thread_idx)
#define blockIdx (::dhp::emu::machine().block_idx)
#define gridDim (::dhp::emu::machine().grid_dim)
#define __syncthreads() ::dhp::emu::sync_threads()
#define __shfl_xor_sync(mask, v, lane_mask, ...) ::dhp::emu::shfl_xor(v, lane_mask)
#define __syncwarp(...) ::dhp::emu::yield(::dhp::emu::Stop::shuffle)
