#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/elementwise_kernels.cuh"

namespace dhp::cuda {
namespace {

template <class S>
__global__ void add_kernel(S* y, const S* x, int64_t n) { ew::add_block(y, x, n); }

template <class S>
__global__ void accumulate_kernel(float* acc, const S* x, int64_t n) {
  ew::accumulate_block(acc, x, n);
}

__global__ void add4_kernel(float4* y, const float4* x, int64_t n4) { ew::add4_block(y, x, n4); }

__global__ void scale_kernel(float* y, float s, int64_t n) { ew::scale_block(y, s, n); }

template <class S>
__global__ void fill_kernel(S* y, float value, int64_t n) { ew::fill_block(y, value, n); }

__global__ void cast_kernel(bf16* y, const float* x, int64_t n) { ew::cast_block(y, x, n); }

// One 32 x 32 tile per block through shared memory (padded against bank conflicts), so that
// reads and writes both run along rows.
__global__ void transpose_kernel(float* dst, const float* src, int64_t rows, int64_t cols) {
  __shared__ float tile[32][33];
  const int64_t r0 = int64_t(blockIdx.y) * 32, c0 = int64_t(blockIdx.x) * 32;
  for (int i = int(threadIdx.y); i < 32; i += int(blockDim.y)) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int i = int(threadIdx.y); i < 32; i += int(blockDim.y)) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
  }
}

__global__ void sum_squares_partial(double* partial, const float* x, int64_t n) {
  __shared__ double shared[kWarp];
  ew::sum_squares_partial_block(partial, x, n, shared);
}

__global__ void sum_partials(double* out, const double* partial, int n) {
  __shared__ double shared[kWarp];
  ew::sum_partials_block(out, partial, n, shared);
}

template <class S>
__global__ void row_bias_kernel(S* y, const S* b, int64_t T, int64_t C) {
  ew::row_bias_block(y, b, T, C);
}

template <class S>
__global__ void copy_rows_kernel(S* dst, const S* src, const int32_t* slot, int64_t C,
                                 bool scatter) {
  ew::copy_rows_block(dst, src, slot, C, scatter);
}

template <class S>
__global__ void column_sum_kernel(float* db, const S* x, int64_t T, int64_t C) {
  __shared__ ew::ColumnShared part;
  ew::column_sum_block(db, x, T, C, part);
}

}  // namespace

template <class S>
void add_inplace(cudaStream_t stream, S* y, const S* x, int64_t n) {
  if (n <= 0) return;
  if constexpr (std::is_same_v<S, float>) {
    if (ew::add_vec4(y, x, n)) {
      const LaunchDims l = ew::launch(n / 4);
      add4_kernel<<<l.grid(), l.block(), 0, stream>>>(reinterpret_cast<float4*>(y),
                                                      reinterpret_cast<const float4*>(x), n / 4);
      DHP_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const LaunchDims l = ew::launch(n);
  add_kernel<<<l.grid(), l.block(), 0, stream>>>(y, x, n);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void accumulate(cudaStream_t stream, float* acc, const S* x, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = ew::launch(n);
  accumulate_kernel<<<l.grid(), l.block(), 0, stream>>>(acc, x, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void scale_inplace(cudaStream_t stream, float* y, float s, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = ew::launch(n);
  scale_kernel<<<l.grid(), l.block(), 0, stream>>>(y, s, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void transpose(cudaStream_t stream, float* dst, const float* src, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32)), block(32, 8);
  transpose_kernel<<<grid, block, 0, stream>>>(dst, src, rows, cols);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void fill(cudaStream_t stream, S* y, float value, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = ew::launch(n);
  fill_kernel<<<l.grid(), l.block(), 0, stream>>>(y, value, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void cast(cudaStream_t stream, bf16* y, const float* x, int64_t n) {
  if (n <= 0) return;
  const LaunchDims l = ew::launch(n);
  cast_kernel<<<l.grid(), l.block(), 0, stream>>>(y, x, n);
  DHP_CUDA_CHECK_LAUNCH();
}

void sum_squares(cudaStream_t stream, double* out, double* partial, const float* x, int64_t n) {
  const LaunchDims lp = ew::sum_squares_launch();
  sum_squares_partial<<<lp.grid(), lp.block(), 0, stream>>>(partial, x, n);
  DHP_CUDA_CHECK_LAUNCH();
  const LaunchDims ls = ew::partials_launch();
  sum_partials<<<ls.grid(), ls.block(), 0, stream>>>(out, partial, kSumSquaresBlocks);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void scatter_rows(cudaStream_t stream, S* y, const S* src, const int32_t* slot, int64_t T,
                  int64_t C) {
  if (T <= 0 || C <= 0) return;
  const LaunchDims l = ew::rows_launch(T);
  copy_rows_kernel<<<l.grid(), l.block(), 0, stream>>>(y, src, slot, C, true);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void gather_rows(cudaStream_t stream, S* dsrc, const S* dy, const int32_t* slot, int64_t T,
                 int64_t C) {
  if (T <= 0 || C <= 0) return;
  const LaunchDims l = ew::rows_launch(T);
  copy_rows_kernel<<<l.grid(), l.block(), 0, stream>>>(dsrc, dy, slot, C, false);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void add_row_bias(cudaStream_t stream, S* y, const S* b, int64_t T, int64_t C) {
  if (T <= 0 || C <= 0) return;
  const LaunchDims l = ew::launch(T * C);
  row_bias_kernel<<<l.grid(), l.block(), 0, stream>>>(y, b, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

template <class S>
void column_sum_add(cudaStream_t stream, float* db, const S* x, int64_t T, int64_t C) {
  if (C <= 0) return;
  const LaunchDims l = ew::columns_launch(C);
  column_sum_kernel<<<l.grid(), l.block(), 0, stream>>>(db, x, T, C);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_ELEMENTWISE_INSTANCES(S)                                                            \
  template void add_inplace<S>(cudaStream_t, S*, const S*, int64_t);                           \
  template void accumulate<S>(cudaStream_t, float*, const S*, int64_t);                        \
  template void fill<S>(cudaStream_t, S*, float, int64_t);                                     \
  template void scatter_rows<S>(cudaStream_t, S*, const S*, const int32_t*, int64_t, int64_t); \
  template void gather_rows<S>(cudaStream_t, S*, const S*, const int32_t*, int64_t, int64_t);  \
  template void add_row_bias<S>(cudaStream_t, S*, const S*, int64_t, int64_t);                 \
  template void column_sum_add<S>(cudaStream_t, float*, const S*, int64_t, int64_t);
DHP_ELEMENTWISE_INSTANCES(float)
DHP_ELEMENTWISE_INSTANCES(bf16)
#undef DHP_ELEMENTWISE_INSTANCES

}  // namespace dhp::cuda
