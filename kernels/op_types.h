// Plain descriptions of op arguments, shared by every backend. Pointers inside them are
// device pointers of the backend the op runs on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/rope_spec.h"

namespace dhp {

// The storage of activations and of the working copy of the weights: fp32, or bf16 where a
// backend trains in bf16 (fp32 master weights, gradients and optimizer state stay fp32).
enum class DType : uint8_t { F32, BF16 };
constexpr size_t dtype_size(DType t) { return t == DType::BF16 ? 2 : 4; }
const char* dtype_name(DType t);

// A device pointer to elements of a run-time storage dtype, so that the model is written once
// for every precision while buffers of another dtype (fp32 statistics, gradients) keep plain
// float pointers. A float pointer converts implicitly: fp32 callers need no change. Pointer
// arithmetic steps whole elements of the pointer's dtype.
template <class V>  // void or const void
struct ActPtrOf {
  V* p = nullptr;
  DType t = DType::F32;

  ActPtrOf() = default;
  ActPtrOf(V* p_, DType t_) : p(p_), t(t_) {}
  ActPtrOf(std::nullptr_t) {}
  template <class F>
    requires(std::is_same_v<F, float> || std::is_same_v<F, const float>)
  ActPtrOf(F* f) : p(f) {}
  template <class W>
    requires(std::is_const_v<V> && !std::is_same_v<W, V>)
  ActPtrOf(ActPtrOf<W> o) : p(o.p), t(o.t) {}

  explicit operator bool() const { return p != nullptr; }
  bool is_f32() const { return t == DType::F32; }
  ActPtrOf operator+(int64_t n) const {
    using Byte = std::conditional_t<std::is_const_v<V>, const char, char>;
    return {static_cast<Byte*>(p) + n * int64_t(dtype_size(t)), t};
  }
  // The fp32 view; the caller has checked is_f32() (kernels/check.h: act_f32 checks it).
  auto* f32() const {
    using F = std::conditional_t<std::is_const_v<V>, const float, float>;
    return static_cast<F*>(p);
  }
};
using Act = ActPtrOf<void>;
using CAct = ActPtrOf<const void>;

// The runs of a call's tokens on the host (kernels/attention_runs.h): maximal spans of one
// document and one block whose idx counts up by one, or does anything under a block.
struct AttnRun {
  int64_t start = 0, len = 0;  // tokens start .. start+len of the call's buffer
  int32_t doc = 0, blk = -1;
  int32_t idx_lo = 0, idx_hi = 0;  // bounds of idx over the run
  bool consecutive = true;         // idx[start + i] == idx_lo + i
  bool operator==(const AttnRun&) const = default;
};

struct AttnRuns {
  const AttnRun* p = nullptr;
  int64_t n = 0;
  const AttnRun* begin() const { return p; }
  const AttnRun* end() const { return p + n; }
};

// Per-token attention metadata (kernels/cpu/attention.h explains the mask):
//   query q may see key k  <=>  doc[q] == doc[k]  and  (idx[k] <= idx[q]  or
//                                                       blk[q] >= 0 and blk[q] == blk[k])
struct AttnMeta {
  const int32_t* doc;  // (T)
  const int32_t* idx;  // (T)
  const int32_t* blk;  // (T), -1 = not in a bidirectional block
  // The same tokens' runs, on the host, where the caller has them (empty: unknown). Lets a
  // backend run the call through a library that takes per-sequence lengths.
  AttnRuns runs{};
};

struct AttnShape {
  int64_t Tq, Tk;
  int Hq, Hkv, hd;
  float scale;  // usually 1 / sqrt(hd)
};

// The GELU family. Tanh: 0.5·x·(1 + tanh(sqrt(2/pi)·(x + 0.044715·x³))), dhp's native
// projector and SigLIP's gelu_pytorch_tanh. Erf: 0.5·x·(1 + erf(x / sqrt 2)), nn.GELU() as in
// LLaVA's projector. Quick: x·sigmoid(1.702·x), CLIP's quick_gelu.
enum class GeluKind : uint8_t { Tanh, Erf, Quick };
const char* gelu_kind_name(GeluKind k);

// How a pretrained position grid is resized to an image's patch grid (kernels/pos_resize.h):
// PyTorch's bicubic (CLIP, SigLIP) or Qwen3-VL's bilinear over linspace(0, in-1, out).
enum class PosResize : uint8_t { bicubic, bilinear_corners };

// One image's rows in a vision encoder stream (Ops::vision_embed_forward).
struct PosImage {
  int64_t row;             // first row: the class row when the op's cls is given, else patch (0,0)
  int32_t grid_h, grid_w;  // the image's patch grid; patches follow row-major
};

// One image of the m x m patch merge.
struct MergeImage {
  int64_t patch_offset;  // first patch row of the image in the input
  int grid_h, grid_w;    // patch grid; both multiples of m
};

// The per-channel normalisation of RGB pixels: y = (x / 255 - mean[c]) / std[c].
struct PixelNorm {
  float mean[3], std[3];
};

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t t;  // 1-based step for bias correction
};

// What cross_entropy_forward adds to its statistics buffer: three doubles, in this order.
struct CrossEntropyStats {
  double loss_sum = 0.0;  // sum of -log p(target) over rows with a target
  double count = 0.0;     // rows with a target
  double correct = 0.0;   // rows whose argmax equals the target
};
static_assert(sizeof(CrossEntropyStats) == 3 * sizeof(double));

}  // namespace dhp
