// Host vectors in a kernel storage type (float or cuda::bf16) and back, for the CUDA tests.
// In the emulated suites, include it after tests/cuda_emulator.h.
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/cuda/storage.cuh"

namespace dhp::testing {

template <class T>
std::vector<T> stored(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  std::transform(x.begin(), x.end(), y.begin(), [](float e) { return cuda::st<T>(e); });
  return y;
}

template <class T>
std::vector<float> widened(const std::vector<T>& x) {
  std::vector<float> y(x.size());
  std::transform(x.begin(), x.end(), y.begin(), [](T e) { return cuda::ld(e); });
  return y;
}

}  // namespace dhp::testing
