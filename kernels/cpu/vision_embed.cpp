#include "kernels/cpu/vision_embed.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"

namespace dhp::cpu {
namespace {

// Channels per step: the forward pass's accumulators, the backward pass's tasks.
constexpr int64_t kChunk = 16;

void check_shapes(const PosImage* images, int n_images, int64_t C, int g0h, int g0w) {
  DHP_CHECK(g0h > 0 && g0w > 0, "vision_embed: the pretrained position grid is {}x{}", g0h, g0w);
  DHP_CHECK(C > 0, "vision_embed: {} channels", C);
  for (int i = 0; i < n_images; ++i)
    DHP_CHECK(images[i].grid_h > 0 && images[i].grid_w > 0 && images[i].row >= 0,
              "vision_embed: image {} of {} has a {}x{} patch grid at row {}", i, n_images,
              images[i].grid_h, images[i].grid_w, images[i].row);
}

}  // namespace

void vision_embed_forward(float* x, const float* table, const float* cls, const PosImage* images,
                          int n_images, int64_t C, int g0h, int g0w, PosResize resize) {
  check_shapes(images, n_images, C, g0h, g0w);
  const int64_t off = cls ? 1 : 0;
  for (int i = 0; i < n_images; ++i) {
    const PosImage im = images[i];
    if (cls)
      for (int64_t ch = 0; ch < C; ++ch) x[im.row * C + ch] = cls[ch] + table[ch];
    float* patches = x + (im.row + off) * C;
    const int64_t gh = im.grid_h, gw = im.grid_w;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < gh * gw; ++p) {
      const ResizeTaps ty = resize_taps(resize, p / gw, g0h, gh), tx = resize_taps(resize, p % gw, g0w, gw);
      float* xp = patches + p * C;
      for (int64_t c0 = 0; c0 < C; c0 += kChunk) {
        const int64_t n = std::min(kChunk, C - c0);
        double acc[kChunk] = {};
        for (int a = 0; a < 4; ++a) {
          const float* row = table + (off + ty.idx[a] * g0w) * C + c0;
          for (int b = 0; b < 4; ++b) {
            const double w = ty.w[a] * tx.w[b];
            const float* v = row + tx.idx[b] * C;
            for (int64_t k = 0; k < n; ++k) acc[k] += w * v[k];
          }
        }
        for (int64_t k = 0; k < n; ++k) xp[c0 + k] = float(xp[c0 + k] + acc[k]);
      }
    }
  }
}

void vision_embed_backward(float* dtable, float* dcls, const float* dx, const PosImage* images,
                           int n_images, int64_t C, int g0h, int g0w, PosResize resize) {
  if (!dtable && !dcls) return;  // both frozen
  check_shapes(images, n_images, C, g0h, g0w);
  const int64_t off = dcls ? 1 : 0, cells = int64_t(g0h) * g0w;
  const int64_t chunks = (C + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t c0 = chunk * kChunk, n = std::min(kChunk, C - c0);
    if (dcls) {
      double acc[kChunk] = {};
      for (int i = 0; i < n_images; ++i)
        for (int64_t k = 0; k < n; ++k) acc[k] += dx[images[i].row * C + c0 + k];
      for (int64_t k = 0; k < n; ++k) {
        dcls[c0 + k] = float(dcls[c0 + k] + acc[k]);
        if (dtable) dtable[c0 + k] = float(dtable[c0 + k] + acc[k]);
      }
    }
    if (!dtable) continue;
    // The grid's sums for this chunk's channels, in double, added to dtable once.
    std::vector<double> acc(size_t(cells * n), 0.0);
    for (int i = 0; i < n_images; ++i) {
      const PosImage im = images[i];
      const int64_t gh = im.grid_h, gw = im.grid_w;
      const float* patches = dx + (im.row + off) * C + c0;
      for (int64_t p = 0; p < gh * gw; ++p) {
        const ResizeTaps ty = resize_taps(resize, p / gw, g0h, gh), tx = resize_taps(resize, p % gw, g0w, gw);
        const float* g = patches + p * C;
        for (int a = 0; a < 4; ++a)
          for (int b = 0; b < 4; ++b) {
            const double w = ty.w[a] * tx.w[b];
            double* d = acc.data() + (ty.idx[a] * g0w + tx.idx[b]) * n;
            for (int64_t k = 0; k < n; ++k) d[k] += w * g[k];
          }
      }
    }
    for (int64_t cell = 0; cell < cells; ++cell)
      for (int64_t k = 0; k < n; ++k) {
        float& d = dtable[(off + cell) * C + c0 + k];
        d = float(d + acc[size_t(cell * n + k)]);
      }
  }
}

}  // namespace dhp::cpu
