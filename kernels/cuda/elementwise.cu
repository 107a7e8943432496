#include "kernels/cuda/check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/reduce.cuh"

namespace dhp::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void add4_kernel(float4* y, const float4* x, int64_t n4) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4;
       i += int64_t(gridDim.x) * blockDim.x) {
    float4 a = y[i], b = x[i];
    y[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
}

__global__ void scale_kernel(float* y, float s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] *= s;
}

__global__ void fill_kernel(float* y, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = value;
}

__global__ void sum_squares_partial(double* partial, const float* x, int64_t n) {
  __shared__ double shared[kWarp];
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    s += double(x[i]) * x[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials(double* out, const double* partial, int n) {
  __shared__ double shared[kWarp];
  double s = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *out = s;
}

__global__ void row_bias_kernel(float* y, const float* b, int64_t T, int64_t C) {
  const int64_t n = T * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += b[i % C];
}

// One block per row; rows without a slot are skipped. dst row = src row.
__global__ void copy_rows_kernel(float* dst, const float* src, const int32_t* slot, int64_t C,
                                 bool scatter) {
  const int64_t t = blockIdx.x;
  const int32_t s = slot[t];
  if (s < 0) return;
  float* d = dst + (scatter ? t : int64_t(s)) * C;
  const float* x = src + (scatter ? int64_t(s) : t) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) d[c] = x[c];
}

// 32 columns per block, 16 row lanes: warps read 128 contiguous bytes; lane sums are combined
// in lane order.
constexpr int kColTile = 32, kRowLanes = 16;

__global__ void column_sum_kernel(float* db, const float* x, int64_t T, int64_t C) {
  __shared__ float part[kRowLanes][kColTile];
  const int64_t c = blockIdx.x * int64_t(kColTile) + threadIdx.x;
  float s = 0.0f;
  if (c < C)
    for (int64_t t = threadIdx.y; t < T; t += kRowLanes) s += x[t * C + c];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int r = 0; r < kRowLanes; ++r) total += part[r][threadIdx.x];
    db[c] += total;
  }
}

}  // namespace

void add_inplace(cudaStream_t stream, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  if (aligned16(y, x) && n % 4 == 0) {
    add4_kernel<<<blocks_for(n / 4, kThreads), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(x), n / 4);
  } else {
    add_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  }
  DHP_CUDA_CHECK_LAUNCH();
}

void scale_inplace(cudaStream_t stream, float* y, float s, int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, s, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void fill(cudaStream_t stream, float* y, float value, int64_t n) {
  if (n <= 0) return;
  fill_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(y, value, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void sum_squares(cudaStream_t stream, double* out, double* partial, const float* x, int64_t n) {
  // The grid is fixed (not sized by the device), so the summation order is too.
  sum_squares_partial<<<kSumSquaresBlocks, kThreads, 0, stream>>>(partial, x, n);
  DHP_CUDA_CHECK_LAUNCH();
  sum_partials<<<1, 1024, 0, stream>>>(out, partial, kSumSquaresBlocks);
  DHP_CUDA_CHECK_LAUNCH();
}

void scatter_rows(cudaStream_t stream, float* y, const float* src, const int32_t* slot, int64_t T,
                  int64_t C) {
  if (T <= 0 || C <= 0) return;
  copy_rows_kernel<<<unsigned(T), kThreads, 0, stream>>>(y, src, slot, C, true);
  DHP_CUDA_CHECK_LAUNCH();
}

void gather_rows(cudaStream_t stream, float* dsrc, const float* dy, const int32_t* slot,
                 int64_t T, int64_t C) {
  if (T <= 0 || C <= 0) return;
  copy_rows_kernel<<<unsigned(T), kThreads, 0, stream>>>(dsrc, dy, slot, C, false);
  DHP_CUDA_CHECK_LAUNCH();
}

void add_row_bias(cudaStream_t stream, float* y, const float* b, int64_t T, int64_t C) {
  if (T <= 0 || C <= 0) return;
  row_bias_kernel<<<blocks_for(T * C, kThreads), kThreads, 0, stream>>>(y, b, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

void column_sum_add(cudaStream_t stream, float* db, const float* x, int64_t T, int64_t C) {
  if (C <= 0) return;
  column_sum_kernel<<<unsigned((C + kColTile - 1) / kColTile), dim3(kColTile, kRowLanes), 0,
                      stream>>>(db, x, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
