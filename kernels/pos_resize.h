// How a pretrained ViT's position grid is resized to an image's patch grid (Ops::
// vision_embed_forward), one definition for the CPU reference, the CUDA kernels and the thread
// emulator of the tests, evaluated in double. Separable: per axis, output sample `dst` of a
// resize from `in` to `out` samples is a weighted sum of (up to) four input samples, its taps.
//
//   bicubic (CLIP, SigLIP: transformers' interpolate_pos_encoding, PyTorch's
//     F.interpolate(mode="bicubic", align_corners=False)): src = (dst + 0.5)·(in / out) - 0.5,
//     not clamped; i = floor(src), t = src - i; taps i-1 .. i+2, each index clamped to
//     [0, in-1], weighing Keys' cubic convolution with A = -0.75 at distances 1+t, t, 1-t, 2-t.
//   bilinear_corners (Qwen3-VL's fast_pos_embed_interpolate): src = linspace(0, in-1, out)[dst]
//     = dst·(in-1)/(out-1) (0 when out = 1); i = floor(src), d = src - i; taps i and
//     min(i+1, in-1) weighing 1-d and d (the other two weigh 0).
// Same size is the identity in both (weights 0, 1, 0, 0 and 1, 0 exactly).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/op_types.h"

#if defined(__CUDACC__)
#define DHP_RESIZE_FN __host__ __device__ inline
#else
#define DHP_RESIZE_FN inline
#endif

namespace dhp {

struct ResizeTaps {
  int64_t idx[4];
  double w[4];
};

DHP_RESIZE_FN double cubic_near(double d) { return ((-0.75 + 2.0) * d - (-0.75 + 3.0)) * d * d + 1.0; }
DHP_RESIZE_FN double cubic_far(double d) {
  return ((-0.75 * d - 5.0 * -0.75) * d + 8.0 * -0.75) * d - 4.0 * -0.75;
}
DHP_RESIZE_FN int64_t clamp_index(int64_t i, int64_t in) { return i < 0 ? 0 : i > in - 1 ? in - 1 : i; }

DHP_RESIZE_FN ResizeTaps resize_taps(PosResize mode, int64_t dst, int64_t in, int64_t out) {
  ResizeTaps k;
  if (mode == PosResize::bilinear_corners) {
    const double src = out > 1 ? double(dst) * double(in - 1) / double(out - 1) : 0.0;
    const double fl = floor(src);
    const double d = src - fl;
    k.idx[0] = clamp_index(int64_t(fl), in);
    k.idx[1] = clamp_index(int64_t(fl) + 1, in);
    k.idx[2] = k.idx[3] = k.idx[0];
    k.w[0] = 1.0 - d;
    k.w[1] = d;
    k.w[2] = k.w[3] = 0.0;
    return k;
  }
  const double src = (double(dst) + 0.5) * (double(in) / double(out)) - 0.5;
  const double fl = floor(src);
  const double t = src - fl;
  k.w[0] = cubic_far(t + 1.0);
  k.w[1] = cubic_near(t);
  k.w[2] = cubic_near(1.0 - t);
  k.w[3] = cubic_far(2.0 - t);
  for (int j = 0; j < 4; ++j) k.idx[j] = clamp_index(int64_t(fl) - 1 + j, in);
  return k;
}

// The output samples [lo, hi] whose taps may reach input sample i: a superset (margins of one);
// the exact test is the taps' own indices.
DHP_RESIZE_FN void resize_reach(PosResize mode, int64_t i, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  if (mode == PosResize::bilinear_corners) {
    // src in [i-1, i+1] reaches i; src = dst·(in-1)/(out-1).
    if (in <= 1 || out <= 1) {
      lo = 0, hi = out - 1;
      return;
    }
    const double per = double(out - 1) / double(in - 1);
    lo = int64_t(floor(double(i - 1) * per)) - 1;
    hi = int64_t(ceil(double(i + 1) * per)) + 1;
  } else {
    const double per = double(out) / double(in);
    lo = int64_t(floor((double(i) - 1.5) * per - 0.5)) - 1;
    hi = int64_t(ceil((double(i) + 2.5) * per - 0.5)) + 1;
  }
  if (lo < 0) lo = 0;
  if (hi > out - 1) hi = out - 1;
}

}  // namespace dhp
