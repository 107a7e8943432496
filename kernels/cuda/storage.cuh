// Element storage of the kernels: fp32, or bf16 for activations and working weights
// (Ops::dtype). Kernels load either as fp32, compute in fp32 and round once when they store.
// Outside nvcc (the thread emulator of the tests, which runs kernel bodies on the CPU) bf16 is
// a 16-bit word with the same bits and the same rounding (kernels/cpu/bf16.h).
#pragma once

#include <cstdint>

#if defined(__CUDACC__) || !defined(DHP_EMULATED_CUDA)
#include <cuda_bf16.h>
#else
#include "core/bf16.h"
#endif

namespace dhp::cuda {

#if defined(__CUDACC__) || !defined(DHP_EMULATED_CUDA)
using bf16 = __nv_bfloat16;
#define DHP_STORAGE_FN __host__ __device__ __forceinline__
DHP_STORAGE_FN float ld(bf16 x) { return __bfloat162float(x); }
DHP_STORAGE_FN bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }
#else
struct bf16 {
  uint16_t bits;
};
#define DHP_STORAGE_FN inline
inline float ld(bf16 x) { return bf16_to_float(x.bits); }
inline bf16 to_bf16(float x) { return bf16{bf16_from_float(x)}; }
#endif

DHP_STORAGE_FN float ld(float x) { return x; }

// The value x stored as a T.
template <class T>
DHP_STORAGE_FN T st(float x);
template <>
DHP_STORAGE_FN float st<float>(float x) {
  return x;
}
template <>
DHP_STORAGE_FN bf16 st<bf16>(float x) {
  return to_bf16(x);
}

}  // namespace dhp::cuda
