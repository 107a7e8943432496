// The CUDA attention entry points (kernels/cuda/attention.h): argument checks, the dispatch to
// the head-dimension instances (attention_launch.h), and the log-sum-exp merge.
#include "kernels/cuda/attention.h"

#include <cmath>

#include "kernels/cuda/attention_checks.h"
#include "kernels/cuda/attention_launch.h"
#include "kernels/cuda/attention_merge.cuh"
#include "kernels/cuda/check.h"

namespace dhp::cuda {
namespace {

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
      unreachable("check_attention_shape admits only instantiated head dimensions");
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
  check_attention_shape(s, attn::kTile, attn::supported_head_dim(s.hd));
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
  check_attention_shape(s, attn::kTile, attn::supported_head_dim(s.hd));
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
  const int64_t rows = T * H;
  const int64_t blocks = (rows * 32 + attn::kMergeThreads - 1) / attn::kMergeThreads;
  check_merge_shape(T, H, hd, blocks);
  if (rows == 0) return;
  merge_kernel<<<unsigned(blocks), attn::kMergeThreads, 0, stream>>>(out, lse, part_out, part_lse,
                                                                     T, H, hd);
  DHP_CUDA_CHECK_LAUNCH();
}

}  // namespace dhp::cuda
