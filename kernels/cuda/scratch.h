// The device scratch the ops need (CudaOps allocates it once, kernels never allocate): sizes
// and layouts shared by the launchers, the kernel bodies and the emulated tests. No CUDA
// header, so the kernel bodies compile without one.
#pragma once

#include <cstdint>

namespace dhp::cuda {

// Rows whose loss and hit one cross-entropy forward launch can hold; the rows buffer has room
// for this many.
constexpr int64_t kCrossEntropyRows = 4096;
struct CrossEntropyRow {
  double loss;  // -log p(target), 0 without a target
  int hit;      // argmax == target
  int counted;  // target >= 0
};

// Floats of the RMSNorm weight gradient's row-slice sums (norm_kernels.cuh): 4 MiB, room for
// 256 slices of a 4096-wide row.
constexpr int64_t kNormDwPartialFloats = int64_t(1) << 20;

// Blocks of the first stage of sum_squares; its partial buffer holds this many doubles.
constexpr int kSumSquaresBlocks = 1024;

}  // namespace dhp::cuda
