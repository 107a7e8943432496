// The CUDA attention entry points (declared in kernels/cuda/launch.h): argument checks, the dispatch to
// the head-dimension instances (attention_launch.h), and the log-sum-exp merge.
#include "kernels/cuda/launch.h"

#include <cmath>
#include <type_traits>

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

template <class S>
__global__ void merge_kernel(float* out, float* lse, const S* part_out, const float* part_lse,
                             int64_t T, int H, int hd) {
  attn::merge_block(out, lse, part_out, part_lse, T, H, hd);
}

}  // namespace

template <class S>
void attention_forward(cudaStream_t stream, S* out, float* lse, const S* q, const S* k,
                       const S* v, AttnMeta qm, AttnMeta km, const AttnShape& s,
                       AttnMath math) {
  check_attention_shape(s, attn::kTile, attn::supported_head_dim(s.hd));
  if (s.Tq == 0) return;
  const attn::FwdParams<S> p{out, lse, q, k, v, qm, km, s.Tq, s.Tk, s.Hq, s.Hkv, s.scale};
  by_head_dim(s.hd, [&]<int HD>() {
    if constexpr (!std::is_same_v<S, float>)
      attn::launch_forward<HD, true>(stream, p);
    else if (math == AttnMath::tf32)
      attn::launch_forward<HD, true>(stream, p);
    else
      attn::launch_forward<HD, false>(stream, p);
  });
}

template <class S>
void attention_backward(cudaStream_t stream, S* dq, S* dk, S* dv, const S* dout, const S* out,
                        const float* lse, const S* q, const S* k, const S* v, AttnMeta qm,
                        AttnMeta km, const AttnShape& s, AttnMath math) {
  check_attention_shape(s, attn::kTile, attn::supported_head_dim(s.hd));
  const attn::BwdParams<S> p{dq, dk, dv, dout, out,  lse,  q,     k,
                             v,  qm, km, s.Tq, s.Tk, s.Hq, s.Hkv, s.scale};
  by_head_dim(s.hd, [&]<int HD>() {
    if constexpr (!std::is_same_v<S, float>)
      attn::launch_backward<HD, true>(stream, p);
    else if (math == AttnMath::tf32)
      attn::launch_backward<HD, true>(stream, p);
    else
      attn::launch_backward<HD, false>(stream, p);
  });
}

template <class S>
void attention_merge(cudaStream_t stream, float* out, float* lse, const S* part_out,
                     const float* part_lse, int64_t T, int H, int hd) {
  const int64_t rows = T * H;
  const int64_t blocks = (rows * 32 + attn::kMergeThreads - 1) / attn::kMergeThreads;
  check_merge_shape(T, H, hd, blocks);
  if (rows == 0) return;
  merge_kernel<<<unsigned(blocks), attn::kMergeThreads, 0, stream>>>(out, lse, part_out, part_lse,
                                                                     T, H, hd);
  DHP_CUDA_CHECK_LAUNCH();
}

#define DHP_ATTENTION_ENTRIES(S)                                                              \
  template void attention_forward<S>(cudaStream_t, S*, float*, const S*, const S*, const S*,  \
                                     AttnMeta, AttnMeta, const AttnShape&, AttnMath);         \
  template void attention_backward<S>(cudaStream_t, S*, S*, S*, const S*, const S*,           \
                                      const float*, const S*, const S*, const S*, AttnMeta,   \
                                      AttnMeta, const AttnShape&, AttnMath);                  \
  template void attention_merge<S>(cudaStream_t, float*, float*, const S*, const float*, int64_t, \
                                   int, int);
DHP_ATTENTION_ENTRIES(float)
DHP_ATTENTION_ENTRIES(bf16)
#undef DHP_ATTENTION_ENTRIES

}  // namespace dhp::cuda
