// The CUDA backend's kernels other than the GEMMs and attention (kernels/cuda/*_kernels.cuh)
// run on the CPU by the thread emulator (tests/cuda_emulator.h, tests/cuda_emulator_ext.h)
// against the CPU reference: every row of the op table (tests/ops_table) in fp32 and bf16
// storage through tests/emulated_ops.h, which launches the bodies on the grid and block their
// launchers use, and below, what the table's comparisons cannot see: the deterministic
// reductions against the error bounds of their summation order, the choice of vector path,
// the statistics kernel alone. Shapes are small and fill blocks and tiles exactly and with
// tails (fibers are slow). CPU-only: no CUDA library or header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/norm.h"
#include "kernels/op_types.h"
#include "tests/expect_close.h"
#include "tests/grad_check.h"
#include "tests/op_checks.h"

// clang-format off
// The emulator defines CUDA's keywords and built-ins: after every other header, before the
// kernel bodies.
#include "tests/cuda_emulator_ext.h"
#include "kernels/cuda/activation_kernels.cuh"
#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/channel_scale_kernels.cuh"
#include "kernels/cuda/layernorm_kernels.cuh"
#include "kernels/cuda/norm_kernels.cuh"
#include "kernels/cuda/patch_merge_kernels.cuh"
#include "kernels/cuda/pixels_kernels.cuh"
#include "kernels/cuda/rope_kernels.cuh"
#include "kernels/cuda/vision_embed_kernels.cuh"
#include "tests/emulated_ops.h"
// clang-format on

namespace dhp {
namespace {

using testing::random_vec;
using testing::run;
using testing::shared_as;
using testing::Tol;

template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref,
                  Tol tol) {
  testing::expect_close(what, got, ref, tol, "emulated");
}

size_t sz(int64_t n) { return size_t(n); }

// One float add per element, in the same order: bit for bit.
constexpr Tol kExact{0.0, 0.0};

// Unit roundoff of float: a sequential float sum of n terms is within about n·eps·sum|terms|
// of the exact sum.
constexpr double kEps = 0x1p-24;

// ---- The op table ---------------------------------------------------------------------------

using Row = std::tuple<testing::OpCase, DType>;

std::vector<Row> rows() {
  std::vector<Row> v;
  for (const auto& c : testing::emulated_cases()) {
    v.emplace_back(c, DType::F32);
    if (c.storage) v.emplace_back(c, DType::BF16);
  }
  return v;
}

class EmulatedOps : public ::testing::TestWithParam<Row> {};

// bf16 rows run against the CPU's bf16 staging (kernels/cpu/staged_ops.h: the fp32 reference
// kernels between the same roundings), on the same bf16 inputs.
TEST_P(EmulatedOps, MatchTheCpuReference) {
  const auto& [c, t] = GetParam();
  BackendOptions opt;
  opt.precision = t == DType::BF16 ? Precision::bf16 : Precision::fp32;
  auto cpu = make_cpu_backend(opt);
  const testing::EmulatedOps ops(t);
  testing::expect_matches_cpu(c, *cpu, ops, cpu->ops(), testing::Side::emulated);
}

INSTANTIATE_TEST_SUITE_P(OpTable, EmulatedOps, ::testing::ValuesIn(rows()), [](const auto& info) {
  return testing::test_name(std::get<0>(info.param)) + "_" + dtype_name(std::get<1>(info.param));
});

// ---- Deterministic reductions and vector paths ----------------------------------------------

// RMSNorm's dw: per slice of rows (one up to 512 rows, then up to 256 slices: Qwen3's q/k
// norms have 128 columns and tokens x heads rows), 16 lanes, then the 16 lane sums, then the
// slices in order; the CPU sums T rows in order. Both within (T + 16)·eps·sum|terms| of the
// exact sum, per column. From the reference's rstd, so that the check stands alone. The
// shapes cover one slice, a ragged last slice, and ten slices of one-head rows.
TEST(CudaEmulated, RmsNormDwWithinItsSummationBound) {
  Rng rng(1);
  const testing::EmulatedOps ops(DType::F32);
  EXPECT_EQ(cuda::norm::dw_slices(512, 128), 1);
  EXPECT_EQ(cuda::norm::dw_slices(1100, 33), 3);
  EXPECT_EQ(cuda::norm::dw_slices(int64_t(1) << 30, 128), cuda::norm::kDwMaxSlices);
  EXPECT_EQ(cuda::norm::dw_slices(int64_t(1) << 30, 8192), cuda::kNormDwPartialFloats / 8192);
  EXPECT_EQ(cuda::norm::dw_slices(int64_t(1) << 30, cuda::kNormDwPartialFloats * 2), 1);
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 300}, {40, 33}, {16, 256},
                      {2, 512}, {1100, 33}, {4800, 128}}) {
    const std::string at = " T=" + std::to_string(T) + " C=" + std::to_string(C);
    auto x = random_vec(rng, sz(T * C)), w = random_vec(rng, sz(C));
    auto dy = random_vec(rng, sz(T * C)), dw0 = random_vec(rng, sz(C));
    std::vector<float> y(sz(T * C)), rstd(sz(T)), dx(sz(T * C)), dw = dw0, edw = dw0;
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, C, cpu::kRmsEps);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, C);
    ops.rmsnorm_backward(dx.data(), edw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, C);
    for (int64_t c = 0; c < C; ++c) {
      double mag = std::abs(double(dw0[size_t(c)]));
      for (int64_t t = 0; t < T; ++t)
        mag += std::abs(double(dy[size_t(t * C + c)]) * x[size_t(t * C + c)] * rstd[size_t(t)]);
      const double err = std::abs(double(edw[size_t(c)]) - dw[size_t(c)]);
      EXPECT_LE(err, 2.0 * double(T + 16) * kEps * mag) << "dw[" << c << "]" << at;
    }
  }
}

// LayerNorm's dw and db: 16 lanes of T/16 rows each, then the 16 lane sums; the CPU sums T rows
// in order. Both within (T + 16)·eps·sum|terms| of the exact sum, per column. From the
// reference's statistics, so that the check stands alone.
TEST(CudaEmulated, LayerNormParamsWithinTheirSummationBound) {
  Rng rng(14);
  const testing::EmulatedOps ops(DType::F32);
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 300}, {40, 33}, {16, 256},
                      {37, 64}}) {
    const std::string at = " T=" + std::to_string(T) + " C=" + std::to_string(C);
    auto x = random_vec(rng, sz(T * C), 2.0f), w = random_vec(rng, sz(C)), b = random_vec(rng, sz(C));
    for (auto& v : x) v += 1.5f;
    auto dy = random_vec(rng, sz(T * C)), dw0 = random_vec(rng, sz(C)), db0 = random_vec(rng, sz(C));
    std::vector<float> y(sz(T * C)), mean(sz(T)), rstd(sz(T)), dx(sz(T * C));
    std::vector<float> dw = dw0, db = db0, edw = dw0, edb = db0;
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), T, C,
                           1e-5f);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                            mean.data(), rstd.data(), T, C);
    ops.layernorm_backward(dx.data(), edw.data(), edb.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), T, C);
    for (int64_t c = 0; c < C; ++c) {
      double mw = std::abs(double(dw0[sz(c)])), mb = std::abs(double(db0[sz(c)]));
      for (int64_t t = 0; t < T; ++t) {
        const double n = (double(x[sz(t * C + c)]) - mean[sz(t)]) * rstd[sz(t)];
        mw += std::abs(double(dy[sz(t * C + c)]) * n);
        mb += std::abs(double(dy[sz(t * C + c)]));
      }
      EXPECT_LE(std::abs(double(edw[sz(c)]) - dw[sz(c)]), 2.0 * double(T + 16) * kEps * mw)
          << "dw[" << c << "]" << at;
      EXPECT_LE(std::abs(double(edb[sz(c)]) - db[sz(c)]), 2.0 * double(T + 16) * kEps * mb)
          << "db[" << c << "]" << at;
    }
  }
}

// The cross-entropy paths the table's comparison does not see: which backward path a shape
// takes (V = 1000, 2052, 512 and 4 the vector one), the scalar path from a base one float off
// 16-byte alignment, and the statistics kernel as a fixed-order sum of the rows it was given.
TEST(CudaEmulated, CrossEntropyPaths) {
  Rng rng(4);
  for (auto [T, V] : {std::pair<int64_t, int64_t>{1, 2}, {17, 23}, {6, 1000}, {5, 2052}, {9, 1537},
                      {3, 512}, {4, 4}}) {
    const std::string at = " T=" + std::to_string(T) + " V=" + std::to_string(V);
    auto logits = random_vec(rng, sz(T * V), 8.0f);
    std::vector<int32_t> targets(sz(T));
    for (auto& t : targets) t = rng.below(5) == 0 ? -1 : int32_t(rng.below(uint64_t(V)));
    std::vector<float> lse(sz(T)), e_lse(sz(T));
    cpu::cross_entropy_forward(lse.data(), logits.data(), targets.data(), T, V);
    std::vector<cuda::CrossEntropyRow> rows(sz(T), cuda::CrossEntropyRow{7.0, 7, 7});
    run(cuda::xent::rows_launch(T), emu::floats_for<cuda::xent::Online[cuda::kWarp]>(),
        [&](float* s) {
          cuda::xent::forward_block(e_lse.data(), rows.data(), logits.data(), targets.data(), V,
                                    &shared_as<cuda::xent::Online>(s));
        });
    const CrossEntropyStats st0{1.5, 2.0, 1.0};
    CrossEntropyStats est = st0;
    run(cuda::xent::stats_launch(), emu::floats_for<double[cuda::kWarp]>(),
        [&](float* s) { cuda::xent::stats_block(&est, rows.data(), T, &shared_as<double>(s)); });
    double loss = st0.loss_sum, mag = std::abs(st0.loss_sum);
    for (const auto& r : rows) loss += r.loss, mag += std::abs(r.loss);
    EXPECT_NEAR(est.loss_sum, loss, double(T + 32) * 0x1p-53 * mag) << at;

    std::vector<float> dl(sz(T * V));
    cpu::cross_entropy_backward(dl.data(), logits.data(), lse.data(), targets.data(), T, V, 0.25f);
    auto in_place = logits;
    EXPECT_EQ(cuda::xent::backward_vec4(in_place.data(), in_place.data(), V), V % 4 == 0) << at;
    std::vector<float> shifted(sz(T * V) + 1, 7.0f);
    float* ds = shifted.data() + 1;
    const bool vec4_shifted = cuda::xent::backward_vec4(ds, logits.data(), V);
    EXPECT_FALSE(vec4_shifted) << at;
    run(cuda::xent::rows_launch(T), 0, [&](float*) {
      cuda::xent::backward_block(ds, logits.data(), lse.data(), targets.data(), V, 0.25f,
                                 vec4_shifted);
    });
    // Same float expressions as the CPU (exp(x - lse) times scale, minus scale at the target).
    expect_close("dlogits misaligned" + at, std::vector<float>(ds, ds + T * V), dl,
                 Tol{1e-6, 1e-5});
  }
}

// The statistics kernel on its own, with rows in every warp of its block and several per
// thread: its three block sums in a row reuse one shared array.
TEST(CudaEmulated, CrossEntropyStats) {
  Rng rng(12);
  for (int64_t n : {int64_t(33), int64_t(1500), cuda::kCrossEntropyRows}) {
    std::vector<cuda::CrossEntropyRow> rows(sz(n));
    CrossEntropyStats ref{1.5, 2.0, 1.0};
    // The reference sum in extended precision, so its own rounding is negligible.
    long double loss = ref.loss_sum;
    double mag = std::abs(ref.loss_sum);
    for (auto& r : rows) {
      r.counted = rng.below(5) != 0;
      r.hit = r.counted && rng.below(3) == 0;
      r.loss = r.counted ? rng.uniform() * 10.0 : 0.0;
      loss += r.loss, ref.count += r.counted, ref.correct += r.hit;
      mag += r.loss;
    }
    ref.loss_sum = double(loss);
    CrossEntropyStats got{1.5, 2.0, 1.0};
    run(cuda::xent::stats_launch(), emu::floats_for<double[cuda::kWarp]>(),
        [&](float* s) { cuda::xent::stats_block(&got, rows.data(), n, &shared_as<double>(s)); });
    const std::string at = " n=" + std::to_string(n);
    // A fixed-order double sum: each thread's run of n/1024 rows, then a tree of 1024.
    EXPECT_NEAR(got.loss_sum, ref.loss_sum, double(n / 1024 + 12) * 0x1p-53 * mag) << at;
    EXPECT_EQ(got.count, ref.count) << at;      // integers, exact in double
    EXPECT_EQ(got.correct, ref.correct) << at;  // integers, exact in double
  }
}

// The first stage always runs kSumSquaresBlocks blocks of 256 threads (about 3 s of fibers), so
// one size: past one element per thread, so threads take one or two and blocks end unevenly.
TEST(CudaEmulated, SumSquares) {
  Rng rng(9);
  const int64_t n = int64_t(cuda::kSumSquaresBlocks) * cuda::ew::kThreads + 1001;
  const auto x = random_vec(rng, sz(n));
  double got = 7.0;
  testing::EmulatedOps(DType::F32).sum_squares(&got, x.data(), n);
  const double ref = cpu::sum_squares(x.data(), n);
  // Both sum exact float squares in double, in different orders; the longest sequential run
  // (the CPU's 16384-element chunks) bounds the relative error by ~2e-12.
  EXPECT_NEAR(got, ref, 1e-11 * ref);
}

TEST(CudaEmulated, RowBiasAndColumnSum) {
  Rng rng(10);
  // Column tiles of 32 and row lanes of 16 exactly filled, and with tails.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},    {5, 33},  {100, 70},
                                                           {17, 300}, {16, 32}, {32, 64}};
  for (auto [T, C] : shapes) {
    const std::string at = " T=" + std::to_string(T) + " C=" + std::to_string(C);
    auto y0 = random_vec(rng, sz(T * C)), b = random_vec(rng, sz(C));
    auto y = y0, e = y0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) y[sz(t * C + c)] += b[sz(c)];
    run(cuda::ew::launch(T * C), 0,
        [&](float*) { cuda::ew::row_bias_block(e.data(), b.data(), T, C); });
    expect_close("row bias" + at, e, y, kExact);  // one float add per element

    auto db = random_vec(rng, sz(C));
    const auto db0 = db;
    run(cuda::ew::columns_launch(C), emu::floats_for<cuda::ew::ColumnShared>(), [&](float* s) {
      cuda::ew::column_sum_block(db.data(), y0.data(), T, C, shared_as<cuda::ew::ColumnShared>(s));
    });
    // 16 lanes of T/16 rows, then the 16 lane sums, in float: within (T + 16)·eps·sum|terms| of
    // the exact sum (here in double), per column.
    for (int64_t c = 0; c < C; ++c) {
      double exact = db0[sz(c)], mag = std::abs(double(db0[sz(c)]));
      for (int64_t t = 0; t < T; ++t)
        exact += y0[sz(t * C + c)], mag += std::abs(y0[sz(t * C + c)]);
      EXPECT_LE(std::abs(db[sz(c)] - exact), double(T + 17) * kEps * mag)
          << "db[" << c << "]" << at;
    }
  }
}

// The weights' working copy rounds to nearest: within half a bf16 step of the master value.
TEST(CudaEmulated, CastRoundsToNearest) {
  Rng rng(13);
  const auto master = random_vec(rng, 11100);
  std::vector<cuda::bf16> cast(master.size());
  testing::EmulatedOps(DType::BF16).cast(Act(cast.data(), DType::BF16), master.data(),
                                         int64_t(master.size()));
  for (size_t i = 0; i < master.size(); ++i)
    ASSERT_LE(std::abs(cuda::ld(cast[i]) - master[i]), 0x1p-8 * std::abs(master[i]) + 1e-30)
        << "cast is not round-to-nearest at " << i;
}

}  // namespace
}  // namespace dhp
