// RoPE's rotation frequencies, one value for every backend: the CPU reference
// (kernels/cpu/rope.cpp), the CUDA kernel (kernels/cuda/rope_kernels.cuh) and the thread
// emulator of the tests evaluate the same rope_inv_freq, in double.
//
// Pair i of a span of n values turns by pos · f_i with f_i = theta^(-2i/n) (model-spec.md).
// Llama-3.x's "llama3" scaling (model.rope_scaling; transformers' _compute_llama3_parameters)
// rescales each f_i by its wavelength λ = 2π / f_i against o = original_max_pos:
//   λ < o / high_freq_factor  ->  f_i                       (short waves kept)
//   λ > o / low_freq_factor   ->  f_i / factor              (long waves slowed)
//   otherwise                 ->  (1 - s) · f_i / factor + s · f_i,
//       s = (o / λ - low_freq_factor) / (high_freq_factor - low_freq_factor)
// Strict inequalities, as transformers; the cos/sin scale stays 1.
//
// M-RoPE (Qwen2-VL's multimodal RoPE; model.mrope_section): each token has three positions,
// temporal, height and width (pos then holds (T, 3)), and pair i of the span turns by one of
// them at the same f_i. The sections give the pairs of each axis (they sum to span / 2):
//   blocked (Qwen2-VL, Qwen2.5-VL):   the first sections[0] pairs by t, the next sections[1]
//                                     by h, the rest by w;
//   interleaved (Qwen3-VL):           pair i by h when i % 3 == 1 and i < 3·sections[1], by w
//                                     when i % 3 == 2 and i < 3·sections[2], by t otherwise.
// A text token has t = h = w, so on text M-RoPE is the plain RoPE of that position.
// With mrope_restart (blocked only) each section's pairs restart the frequencies: pair k of a
// section of n pairs turns at f_k of a span of 2n. That is the Qwen-VL vision towers' 2-D RoPE,
// sections (0, hd/4, hd/4) by patch row and column: transformers' rot_pos_emb concatenates
// row·f and col·f over head_dim / 2 and rotates with rotate_half.
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define DHP_ROPE_FN __host__ __device__ inline
#else
#define DHP_ROPE_FN inline
#endif

namespace dhp {

struct RopeSpec {
  double theta = 10000.0;  // the base
  // Llama-3.x scaling; factor 0 = none (plain RoPE).
  double factor = 0.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  double original_max_pos = 8192.0;

  RopeSpec() = default;
  // Plain RoPE of base `base` (the vision encoder's, and every decoder without scaling).
  RopeSpec(double base) : theta(base) {}  // NOLINT(google-explicit-constructor)
  static RopeSpec llama3(double base, double factor, double low, double high, double original) {
    RopeSpec r(base);
    r.factor = factor;
    r.low_freq_factor = low;
    r.high_freq_factor = high;
    r.original_max_pos = original;
    return r;
  }
  bool scaled() const { return factor > 0.0; }

  // M-RoPE's pairs per axis (t, h, w); all 0 = plain RoPE, one position per token.
  int mrope_section[3] = {0, 0, 0};
  bool mrope_interleaved = false;
  bool mrope_restart = false;
  DHP_ROPE_FN bool mrope() const { return mrope_section[0] + mrope_section[1] + mrope_section[2] > 0; }
};

// The position pair i of token t turns by: pos[t], or under M-RoPE pos[3t + axis of pair i].
DHP_ROPE_FN int32_t rope_position(const RopeSpec& r, const int32_t* pos, int64_t t, int i) {
  if (!r.mrope()) return pos[t];
  const int* s = r.mrope_section;
  int axis = 0;
  if (r.mrope_interleaved) {
    if (i % 3 == 1 && i < 3 * s[1]) axis = 1;
    else if (i % 3 == 2 && i < 3 * s[2]) axis = 2;
  } else {
    axis = i < s[0] ? 0 : i < s[0] + s[1] ? 1 : 2;
  }
  return pos[3 * t + axis];
}

// f_i of pair i in a span of `span` values.
DHP_ROPE_FN double rope_inv_freq(const RopeSpec& r, int i, int span) {
  const double f = pow(r.theta, -2.0 * i / span);
  if (!(r.factor > 0.0)) return f;
  const double two_pi = 6.283185307179586;
  const double wavelength = two_pi / f;
  if (wavelength < r.original_max_pos / r.high_freq_factor) return f;
  if (wavelength > r.original_max_pos / r.low_freq_factor) return f / r.factor;
  const double s = (r.original_max_pos / wavelength - r.low_freq_factor) /
                   (r.high_freq_factor - r.low_freq_factor);
  return (1.0 - s) * f / r.factor + s * f;
}

// The frequency pair i of a span of `span` values turns at: f_i, or with mrope_restart f_k of
// twice its section, k its index in the section.
DHP_ROPE_FN double rope_pair_freq(const RopeSpec& r, int i, int span) {
  if (r.mrope_restart) {
    int start = 0;
    for (int a = 0; a < 3; ++a) {
      const int n = r.mrope_section[a];
      if (i < start + n) return rope_inv_freq(r, i - start, 2 * n);
      start += n;
    }
  }
  return rope_inv_freq(r, i, span);
}

}  // namespace dhp
