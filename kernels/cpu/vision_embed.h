// The position embeddings of a pretrained ViT (CLIP, SigLIP) on an encoder stream, with the
// pretrained g0h x g0w grid resized to each image's own patch grid, as Hugging Face's
// interpolate_pos_encoding does it: PyTorch's F.interpolate(mode="bicubic",
// align_corners=False, size=(grid_h, grid_w)). The resize is linear in the table, so the
// backward pass is its transpose.
//
// The resize, per axis (in -> out samples, separable): the source coordinate
// src = (dst + 0.5)·(in / out) - 0.5, not clamped; i = floor(src), t = src - i; the four taps
// i-1 .. i+2, each index clamped to [0, in-1], weigh Keys' cubic convolution with A = -0.75 at
// distances 1+t, t, 1-t, 2-t. An output is the sum over the 16 taps of (row weight · column
// weight · value). Everything is computed in double and rounded once where it is added to x
// (or to the gradient): PyTorch's resize in float64, to which its float32 kernel is close
// (~1e-6: it takes in / out in float and evaluates the weights in float). Same size is the
// identity (weights 0, 1, 0, 0, exactly).
#pragma once

#include <cstdint>

#include "kernels/op_types.h"

namespace dhp::cpu {

// The taps of output sample `dst` of a resize from `in` to `out` samples.
struct CubicTaps {
  int64_t idx[4];
  double w[4];
};
CubicTaps cubic_taps(int64_t dst, int64_t in, int64_t out);

// x (rows, C): per image, with cls (C) the class row x[row] = cls + table[0] (written) and the
// patches from row + 1; without, from row. Patch (r, c) += the resized grid at (r, c).
// table ((cls ? 1 : 0) + g0h·g0w, C).
void vision_embed_forward(float* x, const float* table, const float* cls, const PosImage* images,
                          int n_images, int64_t C, int g0h, int g0w);
// dtable (n_pos, C) and dcls (C) accumulate; either may be null (frozen). The class row exists
// exactly when dcls is given. Parallel over channels, each channel's images, patches and taps
// summed in one fixed order (in double, added to the gradient once): the same bits for any
// thread count.
void vision_embed_backward(float* dtable, float* dcls, const float* dx, const PosImage* images,
                           int n_images, int64_t C, int g0h, int g0w);

}  // namespace dhp::cpu
