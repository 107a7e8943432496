// The CUDA attention entry points (kernels/cuda/attention.h): argument checks, the dispatch to
// the head-dimension instances (attention_launch.h), and the log-sum-exp merge.
#include "kernels/cuda/attention.h"

#include <cmath>

#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_merge.cuh"
#include "kernels/cuda/check.h"

namespace dhp::cuda {
namespace {

void check_shape(const AttnShape& s) {
  DHP_CHECK(s.Tq >= 0 && s.Tk >= 0, "attention: negative sequence length (Tq={}, Tk={})", s.Tq,
            s.Tk);
  DHP_CHECK(s.Hq > 0 && s.Hkv > 0 && s.Hq % s.Hkv == 0,
            "attention: {} query heads cannot share {} kv heads evenly", s.Hq, s.Hkv);
  DHP_CHECK(attn::supported_head_dim(s.hd),
            "CUDA attention supports head dimensions 16, 32, 64, 80, 96 and 128, not {}; use "
            "the CPU backend or one of those dimensions",
            s.hd);
  DHP_CHECK(s.Hq <= 65535 && s.Tq / attn::kTile < (int64_t(1) << 31) &&
                s.Tk / attn::kTile < (int64_t(1) << 31),
            "CUDA attention: shape too large for one launch (Tq={}, Tk={}, Hq={})", s.Tq, s.Tk,
            s.Hq);
}

template <class F>
void by_head_dim(int hd, F f) {
  switch (hd) {
    case 16:
      f.template operator()<16>();
      break;
    case 32:
      f.template operator()<32>();
      break;
    case 64:
      f.template operator()<64>();
      break;
    case 80:
      f.template operator()<80>();
      break;
    case 96:
      f.template operator()<96>();
      break;
    case 128:
      f.template operator()<128>();
      break;
    default:
      DHP_ASSERT(false && "check_shape admits only instantiated head dimensions");
  }
}

__global__ void merge_kernel(float* out, float* lse, const float* part_out, const float* part_lse,
                             int64_t T, int H, int hd) {
  attn::merge_block(out, lse, part_out, part_lse, T, H, hd);
}

}  // namespace

void attention_forward(cudaStream_t stream, float* out, float* lse, const float* q, const float* k,
                       const float* v, AttnMeta qm, AttnMeta km, const AttnShape& s,
                       AttnMath math) {
  check_shape(s);
  if (s.Tq == 0) return;
  const attn::FwdParams p{out, lse, q, k, v, qm, km, s.Tq, s.Tk, s.Hq, s.Hkv, s.scale};
  by_head_dim(s.hd, [&]<int HD>() {
    if (math == AttnMath::tf32)
      attn::launch_forward<HD, true>(stream, p);
    else
      attn::launch_forward<HD, false>(stream, p);
  });
}

void attention_backward(cudaStream_t stream, float* dq, float* dk, float* dv, const float* dout,
                        const float* out, const float* lse, const float* q, const float* k,
                        const float* v, AttnMeta qm, AttnMeta km, const AttnShape& s,
                        AttnMath math) {
  check_shape(s);
  const attn::BwdParams p{dq, dk, dv, dout, out,  lse,  q,     k,
                          v,  qm, km, s.Tq, s.Tk, s.Hq, s.Hkv, s.scale};
  by_head_dim(s.hd, [&]<int HD>() {
    if (math == AttnMath::tf32)
      attn::launch_backward<HD, true>(stream, p);
    else
      attn::launch_backward<HD, false>(stream, p);
  });
}

void attention_merge(cudaStream_t stream, float* out, float* lse, const float* part_out,
                     const float* part_lse, int64_t T, int H, int hd) {
  DHP_CHECK(T >= 0 && H > 0 && hd > 0, "attention_merge: bad shape T={} H={} hd={}", T, H, hd);
  const int64_t rows = T * H;
  if (rows == 0) return;
  const int64_t blocks = (rows * 32 + attn::kMergeThreads - 1) / attn::kMergeThreads;
  DHP_CHECK(blocks < (int64_t(1) << 31), "attention_merge: {} rows are too many for one launch",
            rows);
  merge_kernel<<<unsigned(blocks), attn::kMergeThreads, 0, stream>>>(out, lse, part_out, part_lse,
                                                                     T, H, hd);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
