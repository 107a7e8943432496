// The bodies of the vision position-embedding kernels (kernels/cuda/vision_embed.cu launches
// them) and their launch shapes; the CPU reference, whose arithmetic these repeat expression
// for expression, is kernels/cpu/vision_embed.h, and both take their taps from
// kernels/pos_resize.h. A thread owns one channel, so every load and
// store of a warp is one contiguous run of a row.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/storage.cuh"
#include "kernels/op_types.h"
#include "kernels/pos_resize.h"

namespace dhp::cuda::vembed {

constexpr int kThreads = 128;
// Forward: blocks per image along y, each taking every kSlices-th patch (the grids live on the
// device, so the launch is sized by images). The y extent is capped; blocks stride over the
// rest.
constexpr int kSlices = 16;
constexpr long long kMaxGridY = 65535;

inline unsigned channel_blocks(int64_t C) { return unsigned((C + kThreads - 1) / kThreads); }
inline LaunchDims forward_launch(int64_t C, int n_images) {
  const long long y = (long long)n_images * kSlices;
  return LaunchDims{channel_blocks(C), unsigned(y < kMaxGridY ? y : kMaxGridY), kThreads, 1};
}
// Backward: one block row per table row it writes (all of them, or the class row alone).
inline LaunchDims backward_launch(int64_t C, int64_t rows) {
  return LaunchDims{channel_blocks(C), unsigned(rows < kMaxGridY ? rows : kMaxGridY), kThreads,
                    1};
}

// blockIdx.y strides over (image, slice) pairs; the slice-0 block of an image writes its class
// row. Patches add the 16-tap sum, in double, rounded once.
template <class S>
__device__ __forceinline__ void forward_block(S* x, const S* table, const S* cls,
                                              const PosImage* images, int n_images, int64_t C,
                                              int g0h, int g0w, PosResize resize) {
  const int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (ch >= C) return;
  const int64_t off = cls ? 1 : 0;
  for (long long pair = blockIdx.y; pair < (long long)n_images * kSlices; pair += gridDim.y) {
    const int slice = int(pair % kSlices);
    const PosImage im = images[pair / kSlices];
    if (cls && slice == 0) x[im.row * C + ch] = st<S>(ld(cls[ch]) + ld(table[ch]));
    const int64_t gh = im.grid_h, gw = im.grid_w;
    S* patches = x + (im.row + off) * C + ch;
    for (int64_t p = slice; p < gh * gw; p += kSlices) {
      const ResizeTaps ty = resize_taps(resize, p / gw, g0h, gh), tx = resize_taps(resize, p % gw, g0w, gw);
      double acc = 0.0;
      for (int a = 0; a < 4; ++a) {
        const S* row = table + (off + ty.idx[a] * g0w) * C + ch;
        for (int b = 0; b < 4; ++b) acc += ty.w[a] * tx.w[b] * double(ld(row[tx.idx[b] * C]));
      }
      S& out = patches[p * C];
      out = st<S>(float(double(ld(out)) + acc));
    }
  }
}

// One thread per (table row, channel), blockIdx.y striding over the rows: each row gathers its
// terms in the CPU's order (images, patches row-major, row taps, column taps), in double,
// added to the gradient once. With dcls, row 0 is the class position: the class rows' sum.
template <class S>
__device__ __forceinline__ void backward_block(float* dtable, float* dcls, const S* dx,
                                               const PosImage* images, int n_images, int64_t C,
                                               int g0h, int g0w, PosResize resize) {
  const int64_t ch = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (ch >= C) return;
  const int64_t off = dcls ? 1 : 0;
  const int64_t rows = dtable ? off + int64_t(g0h) * g0w : 1;
  for (int64_t cell = blockIdx.y; cell < rows; cell += gridDim.y) {
    if (dcls && cell == 0) {
      double acc = 0.0;
      for (int i = 0; i < n_images; ++i) acc += double(ld(dx[images[i].row * C + ch]));
      dcls[ch] = float(double(dcls[ch]) + acc);
      if (dtable) dtable[ch] = float(double(dtable[ch]) + acc);
      continue;
    }
    const int64_t ia = (cell - off) / g0w, ib = (cell - off) % g0w;
    double acc = 0.0;
    for (int i = 0; i < n_images; ++i) {
      const PosImage im = images[i];
      const int64_t gh = im.grid_h, gw = im.grid_w;
      const S* patches = dx + (im.row + off) * C + ch;
      int64_t r0, r1, c0, c1;
      resize_reach(resize, ia, g0h, gh, r0, r1);
      resize_reach(resize, ib, g0w, gw, c0, c1);
      for (int64_t r = r0; r <= r1; ++r) {
        const ResizeTaps ty = resize_taps(resize, r, g0h, gh);
        if (ty.idx[0] != ia && ty.idx[1] != ia && ty.idx[2] != ia && ty.idx[3] != ia) continue;
        for (int64_t c = c0; c <= c1; ++c) {
          const ResizeTaps tx = resize_taps(resize, c, g0w, gw);
          if (tx.idx[0] != ib && tx.idx[1] != ib && tx.idx[2] != ib && tx.idx[3] != ib) continue;
          const double g = double(ld(patches[(r * gw + c) * C]));
          for (int a = 0; a < 4; ++a) {
            if (ty.idx[a] != ia) continue;
            for (int b = 0; b < 4; ++b)
              if (tx.idx[b] == ib) acc += ty.w[a] * tx.w[b] * g;
          }
        }
      }
    }
    float& d = dtable[cell * C + ch];
    d = float(double(d) + acc);
  }
}

}  // namespace dhp::cuda::vembed
