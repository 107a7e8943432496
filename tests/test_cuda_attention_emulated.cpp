// The CUDA attention kernel bodies (kernels/cuda/attention_kernels.cuh) run on the CPU by the
// thread emulator (tests/cuda_emulator.h) against the CPU reference: indexing, masking, tile
// skipping, the online softmax and the barriers are checked on machines without a GPU. Also
// the tile-skipping predicate on its own, against the per-pair mask. CPU-only: no CUDA
// library is linked.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "tests/attention_cases.h"

// clang-format off
// The emulator defines CUDA's keywords and built-ins: after every other header, before the
// kernel bodies.
#include "tests/cuda_emulator.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/attention_merge.cuh"
#include "tests/storage_convert.h"
// clang-format on

namespace dhp {
namespace {

using namespace dhp::cuda::attn;
using testing::AttnCase;
using testing::AttnData;
using testing::expect_close;
using testing::stored;
using testing::widened;

unsigned tiles(int64_t T) { return unsigned((T + kTile - 1) / kTile); }

template <int HD, bool TC, class T>
void run_forward(const FwdParams<T>& p) {
  if (p.Tq == 0) return;
  emu::launch({tiles(p.Tq), unsigned(p.Hq), 1}, kThreads, size_t(forward_smem_floats(HD, TC, int(sizeof(T)))),
              [&](float* smem) { forward_block<HD, TC>(p, smem); });
}

template <int HD, bool TC, class T>
void run_backward(const BwdParams<T>& p) {
  if (p.Tk > 0)
    emu::launch({tiles(p.Tk), unsigned(p.Hkv), 1}, kThreads,
                size_t(backward_kv_smem_floats(HD, TC, int(sizeof(T)))),
                [&](float* smem) { backward_kv_block<HD, TC>(p, smem); });
  if (p.Tq > 0)
    emu::launch({tiles(p.Tq), unsigned(p.Hq), 1}, kThreads,
                size_t(backward_q_smem_floats(HD, TC, int(sizeof(T)))),
                [&](float* smem) { backward_q_block<HD, TC>(p, smem); });
}

template <int HD, bool TC, class T>
void check(const AttnCase& c, uint64_t seed) {
  constexpr bool bf16 = std::is_same_v<T, cuda::bf16>;
  const testing::AttnTolerance tol =
      bf16 ? testing::kBf16Tol : TC ? testing::kTf32Tol : testing::kFp32Tol;
  const AttnData d = testing::reference(c, seed, bf16);
  const AttnShape& s = d.s;
  const std::vector<T> q = stored<T>(d.q), k = stored<T>(d.k), v = stored<T>(d.v);
  const std::vector<T> dout = stored<T>(d.dout), ref_out = stored<T>(d.out);
  // Outputs start as garbage: everything must be written.
  std::vector<T> out(d.out.size(), cuda::st<T>(7.0f));
  std::vector<float> lse(d.lse.size(), 7.0f);
  run_forward<HD, TC, T>({out.data(), lse.data(), q.data(), k.data(), v.data(), c.qm.view(),
                          c.km.view(), s.Tq, s.Tk, s.Hq, s.Hkv, s.scale});
  expect_close(c.name + " out", widened(out), d.out, tol);
  expect_close(c.name + " lse", lse, d.lse, tol);
  // The backward pass from the reference's forward results, so its check stands alone.
  std::vector<T> dq(d.dq.size(), cuda::st<T>(7.0f)), dk(d.dk.size(), cuda::st<T>(7.0f)),
      dv(d.dv.size(), cuda::st<T>(7.0f));
  run_backward<HD, TC, T>({dq.data(), dk.data(), dv.data(), dout.data(), ref_out.data(),
                           d.lse.data(), q.data(), k.data(), v.data(), c.qm.view(), c.km.view(),
                           s.Tq, s.Tk, s.Hq, s.Hkv, s.scale});
  expect_close(c.name + " dq", widened(dq), d.dq, tol);
  expect_close(c.name + " dk", widened(dk), d.dk, tol);
  expect_close(c.name + " dv", widened(dv), d.dv, tol);
}

template <bool TC, class T = float>
void check_case(const AttnCase& c, uint64_t seed) {
  switch (c.hd) {
    case 16:
      check<16, TC, T>(c, seed);
      break;
    case 32:
      check<32, TC, T>(c, seed);
      break;
    case 64:
      check<64, TC, T>(c, seed);
      break;
    case 80:
      check<80, TC, T>(c, seed);
      break;
    case 96:
      check<96, TC, T>(c, seed);
      break;
    case 128:
      check<128, TC, T>(c, seed);
      break;
    default:
      FAIL() << "no instance for hd=" << c.hd;
  }
}

// Every pair (query tile, key tile) of random packs: when may_see is false, no query of the
// one sees any key of the other; and it is false for the pairs the design means to skip
// (different documents, keys all in the future without a shared block).
TEST(CudaAttentionTiles, SkippedTilePairsHaveNoVisiblePair) {
  Rng rng(5);
  int skipped = 0, pairs = 0;
  for (int rep = 0; rep < 40; ++rep) {
    const bool images = rep % 2 == 1;
    const int64_t max_len = rep % 4 < 2 ? 12 : 150;
    const testing::PackMeta qm = testing::random_pack(rng, 300, max_len, images);
    const testing::PackMeta km =
        rep % 3 == 0 ? testing::random_pack(rng, 260, max_len, images, 0, 40, 2) : qm;
    // Tiles of random sizes, so the predicate meets every kind of straddling.
    auto cut = [&](int64_t T) {
      std::vector<int64_t> edges{0};
      while (edges.back() < T)
        edges.push_back(std::min<int64_t>(T, edges.back() + rng.range(1, 80)));
      return edges;
    };
    auto range = [](const testing::PackMeta& m, int64_t a, int64_t b) {
      TileRange r = range_empty();
      for (int64_t i = a; i < b; ++i)
        r = range_merge(r, range_of(m.doc[size_t(i)], m.idx[size_t(i)], m.blk[size_t(i)]));
      return r;
    };
    const auto qe = cut(qm.size()), ke = cut(km.size());
    for (size_t a = 0; a + 1 < qe.size(); ++a)
      for (size_t b = 0; b + 1 < ke.size(); ++b) {
        bool any = false;
        for (int64_t i = qe[a]; i < qe[a + 1]; ++i)
          for (int64_t j = ke[b]; j < ke[b + 1]; ++j)
            any = any || sees(qm.doc[size_t(i)], qm.idx[size_t(i)], qm.blk[size_t(i)],
                              km.doc[size_t(j)], km.idx[size_t(j)], km.blk[size_t(j)]);
        const bool may = may_see(range(qm, qe[a], qe[a + 1]), range(km, ke[b], ke[b + 1]));
        ++pairs;
        skipped += !may;
        if (any) {
          ASSERT_TRUE(may) << "rep " << rep << " query tile " << a << " key tile " << b;
        }
      }
  }
  // Packs of short documents have far more hidden tile pairs than visible ones.
  EXPECT_GT(skipped, pairs / 2);
}

TEST(CudaAttentionTiles, PredicateOnHandMadeTiles) {
  const TileRange text01 = range_merge(range_of(0, 0, -1), range_of(1, 9, -1));
  EXPECT_TRUE(may_see(text01, range_of(1, 9, -1)));
  EXPECT_FALSE(may_see(range_of(0, 5, -1), range_of(1, 0, -1)));  // other document
  EXPECT_FALSE(may_see(range_of(0, 5, -1), range_of(0, 6, -1)));  // future key
  EXPECT_TRUE(may_see(range_of(0, 5, 3), range_of(0, 6, 3)));     // same image
  EXPECT_FALSE(may_see(range_of(0, 5, 3), range_of(0, 6, 4)));    // another image
  EXPECT_FALSE(may_see(range_of(0, 5, -1), range_of(0, 6, 3)));   // text before image
  EXPECT_TRUE(may_see(range_of(0, 6, -1), range_of(0, 6, 3)));    // equal position
}

// The merge against the CPU's, with rows where either part or both saw nothing, hd above and
// below a warp's width.
TEST(CudaAttentionMergeEmulated, MatchesTheCpu) {
  Rng rng(10);
  for (int hd : {16, 80}) {
    const int64_t T = 37;
    const int H = 3;
    auto out = testing::random_vec(rng, size_t(T * H * hd));
    auto part = testing::random_vec(rng, size_t(T * H * hd));
    auto lse = testing::random_vec(rng, size_t(T * H), 4.0f);
    auto plse = testing::random_vec(rng, size_t(T * H), 4.0f);
    const float ninf = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < lse.size(); i += 5) lse[i] = ninf;
    for (size_t i = 0; i < plse.size(); i += 7) plse[i] = ninf;
    std::vector<float> gout = out, glse = lse;
    const unsigned blocks = unsigned((T * H * 32 + kMergeThreads - 1) / kMergeThreads);
    emu::launch({blocks, 1, 1}, kMergeThreads, 0, [&](float*) {
      merge_block(gout.data(), glse.data(), part.data(), plse.data(), T, H, hd);
    });
    // A part in bf16 storage merges into the fp32 running result as its widened values.
    const std::vector<cuda::bf16> part16 = stored<cuda::bf16>(part);
    std::vector<float> bout = out, blse = lse;
    emu::launch({blocks, 1, 1}, kMergeThreads, 0, [&](float*) {
      merge_block(bout.data(), blse.data(), part16.data(), plse.data(), T, H, hd);
    });
    const std::vector<float> part_values = widened(part16);
    std::vector<float> wout = out, wlse = lse;
    cpu::attention_merge(wout.data(), wlse.data(), part_values.data(), plse.data(), T, H, hd);
    cpu::attention_merge(out.data(), lse.data(), part.data(), plse.data(), T, H, hd);
    expect_close("merged out", gout, out);
    expect_close("merged lse", glse, lse);
    expect_close("merged out, bf16 part", bout, wout);
    expect_close("merged lse, bf16 part", blse, wlse);
  }
}

class CudaAttentionEmulated : public ::testing::TestWithParam<int> {};

TEST_P(CudaAttentionEmulated, MatchesTheCpuReference) {
  uint64_t seed = 100;
  for (const AttnCase& c : testing::attention_cases({GetParam()}, 200)) {
    SCOPED_TRACE(c.name);
    check_case<false>(c, seed++);
    if (HasFatalFailure() || HasNonfatalFailure()) return;
  }
}

// The tensor-core variant: the same cases, TF32 tolerances.
TEST_P(CudaAttentionEmulated, Tf32MatchesTheCpuReference) {
  uint64_t seed = 200;
  for (const AttnCase& c : testing::attention_cases({GetParam()}, 200)) {
    SCOPED_TRACE(c.name);
    check_case<true>(c, seed++);
    if (HasFatalFailure() || HasNonfatalFailure()) return;
  }
}

// bf16 storage (always on tensor cores): inputs rounded to bf16, outputs stored in bf16.
TEST_P(CudaAttentionEmulated, Bf16StorageMatchesTheCpuReference) {
  uint64_t seed = 300;
  for (const AttnCase& c : testing::attention_cases({GetParam()}, 200)) {
    SCOPED_TRACE(c.name);
    check_case<true, cuda::bf16>(c, seed++);
    if (HasFatalFailure() || HasNonfatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CudaAttentionEmulated,
                         ::testing::Values(16, 32, 64, 80, 96, 128),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "hd" + std::to_string(i.param);
                         });

}  // namespace
}  // namespace dhp
