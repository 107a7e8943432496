// The position embeddings of a pretrained ViT (CLIP, SigLIP, Qwen3-VL) on an encoder stream,
// with the pretrained g0h x g0w grid resized to each image's own patch grid by the taps of
// kernels/pos_resize.h (PyTorch's bicubic F.interpolate as transformers' interpolate_pos_encoding
// runs it, or Qwen3-VL's bilinear). The resize is linear in the table, so the backward pass is
// its transpose. An output is the sum over the 16 taps of (row weight · column weight · value),
// computed in double and rounded once where it is added to x (or to the gradient): PyTorch's
// resize in float64, to which its float32 kernel is close (~1e-6).
#pragma once

#include <cstdint>

#include "kernels/op_types.h"
#include "kernels/pos_resize.h"

namespace dhp::cpu {

// x (rows, C): per image, with cls (C) the class row x[row] = cls + table[0] (written) and the
// patches from row + 1; without, from row. Patch (r, c) += the resized grid at (r, c).
// table ((cls ? 1 : 0) + g0h·g0w, C).
void vision_embed_forward(float* x, const float* table, const float* cls, const PosImage* images,
                          int n_images, int64_t C, int g0h, int g0w, PosResize resize);
// dtable (n_pos, C) and dcls (C) accumulate; either may be null (frozen). The class row exists
// exactly when dcls is given. Parallel over channels, each channel's images, patches and taps
// summed in one fixed order (in double, added to the gradient once): the same bits for any
// thread count.
void vision_embed_backward(float* dtable, float* dcls, const float* dx, const PosImage* images,
                           int n_images, int64_t C, int g0h, int g0w, PosResize resize);

}  // namespace dhp::cpu
