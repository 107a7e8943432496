// The bodies of the CUDA backend's kernels other than attention (kernels/cuda/*_kernels.cuh)
// run on the CPU by the thread emulator (tests/cuda_emulator.h, tests/cuda_emulator_ext.h)
// against the CPU reference, with the grid and block their launchers use (the same launch-shape
// functions): indexing, grid-stride and tail handling, vector paths, barriers and the
// deterministic reductions are checked on machines without a GPU. Shapes are small and odd
// (fibers are slow). Each comparison allows atol + rtol·|ref| with its reason beside it.
// CPU-only: no CUDA library or header.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/patch_merge.h"
#include "kernels/cpu/pixels.h"
#include "kernels/cpu/rope.h"
#include "kernels/op_types.h"
#include "tests/expect_close.h"
#include "tests/grad_check.h"

// clang-format off
// The emulator defines CUDA's keywords and built-ins: after every other header, before the
// kernel bodies.
#include "tests/cuda_emulator_ext.h"
#include "kernels/cuda/activation_kernels.cuh"
#include "kernels/cuda/adamw_kernels.cuh"
#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/norm_kernels.cuh"
#include "kernels/cuda/patch_merge_kernels.cuh"
#include "kernels/cuda/pixels_kernels.cuh"
#include "kernels/cuda/rope_kernels.cuh"
#include "tests/storage_convert.h"
// clang-format on

namespace dhp {
namespace {

using cuda::LaunchDims;
using testing::random_vec;

using testing::Tol;

// Same float operations in the same order on the same host math library: bit-identical with
// the default flags; the bound leaves room for a build that contracts multiply-adds (-march
// with FMA) in one copy and not the other, which GELU's derivative amplifies where
// 1 - tanh² cancels.
constexpr Tol kPointwise{1e-6, 1e-5};
// Pure copies and permutations: bit for bit.
constexpr Tol kExact{0.0, 0.0};

template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref,
                  Tol tol) {
  testing::expect_close(what, got, ref, tol, "emulated");
}

// Runs body on the launcher's grid and block.
void run(const LaunchDims& l, size_t smem_floats, const std::function<void(float*)>& body) {
  emu::launch_dims({l.grid_x, l.grid_y, 1}, {l.block_x, l.block_y, 1}, smem_floats, body);
}

size_t sz(int64_t n) { return size_t(n); }

template <class T>
T& shared_as(float* smem) {
  return *reinterpret_cast<T*>(smem);
}

// Unit roundoff of float: a sequential float sum of n terms is within about n·eps·sum|terms|
// of the exact sum.
constexpr double kEps = 0x1p-24;

// ---- RMSNorm ------------------------------------------------------------------------------

// The three RMSNorm kernels as the launchers run them: forward (y, its rstd), dw (+=) and dx,
// the backward ones from the reference's rstd so that each check stands alone.
template <class S>
void run_rmsnorm(S* y, float* y_rstd, S* dx, float* dw, const S* x, const S* w, const S* dy,
                 const float* rstd, int64_t T, int64_t C) {
  run(cuda::norm::rows_launch(T), cuda::norm::kRowSharedFloats,
      [&](float* s) { cuda::norm::forward_block(y, y_rstd, x, w, C, s); });
  run(cuda::norm::dw_launch(C), emu::floats_for<cuda::norm::DwShared>(), [&](float* s) {
    cuda::norm::dw_block(dw, dy, x, rstd, T, C, shared_as<cuda::norm::DwShared>(s));
  });
  run(cuda::norm::rows_launch(T), cuda::norm::kRowSharedFloats,
      [&](float* s) { cuda::norm::dx_block(dx, dy, x, w, rstd, C, s); });
}

TEST(CudaEmulated, RmsNorm) {
  Rng rng(1);
  // Rows shorter than, equal to and longer than the block; dw's 16 row lanes and 32-column
  // tiles exactly filled and with tails.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},   {3, 7},    {5, 300},
                                                           {40, 33}, {16, 256}, {2, 512}};
  for (auto [T, C] : shapes) {
    const std::string at = " T=" + std::to_string(T) + " C=" + std::to_string(C);
    auto x = random_vec(rng, sz(T * C)), w = random_vec(rng, sz(C));
    auto dy = random_vec(rng, sz(T * C)), dw0 = random_vec(rng, sz(C));
    std::vector<float> y(sz(T * C)), rstd(sz(T)), dx(sz(T * C)), dw = dw0;
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, C);
    cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, C);

    // Outputs start as garbage: everything must be written.
    std::vector<float> ey(y.size(), 7.0f), er(rstd.size(), 7.0f), edx(dx.size(), 7.0f), edw = dw0;
    run_rmsnorm(ey.data(), er.data(), edx.data(), edw.data(), x.data(), w.data(), dy.data(),
                rstd.data(), T, C);
    // A float sum of C squares in 256 strided lanes against the CPU's double sum.
    expect_close("rstd" + at, er, rstd, Tol{1e-6, 1e-5});
    expect_close("y" + at, ey, y, Tol{1e-6, 1e-5});
    // dx subtracts a row mean of C products: absolute error ~ sqrt(C)·eps of O(1) terms.
    expect_close("dx" + at, edx, dx, Tol{1e-6 * std::sqrt(double(C)), 1e-5});
    // dw: 16 lanes of T/16 rows each, then the 16 lane sums; the CPU sums T rows in order. Both
    // within (T + 16)·eps·sum|terms| of the exact sum, per column.
    for (int64_t c = 0; c < C; ++c) {
      double mag = std::abs(double(dw0[size_t(c)]));
      for (int64_t t = 0; t < T; ++t)
        mag += std::abs(double(dy[size_t(t * C + c)]) * x[size_t(t * C + c)] * rstd[size_t(t)]);
      const double err = std::abs(double(edw[size_t(c)]) - dw[size_t(c)]);
      EXPECT_LE(err, 2.0 * double(T + 16) * kEps * mag) << "dw[" << c << "]" << at;
    }
  }
}

// ---- RoPE ---------------------------------------------------------------------------------

// rope_rotate's launch as the launcher does it (rope2d is two of them).
void rope_run(float* x, const int32_t* pos, int64_t T, int H, int hd, int offset, int span,
              double theta, float sign) {
  const int64_t n = T * (span / 2);
  if (n <= 0) return;
  run(cuda::rope::launch(n), 0,
      [&](float*) { cuda::rope::rotate_block(x, pos, T, H, hd, offset, span, theta, sign); });
}

TEST(CudaEmulated, Rope) {
  Rng rng(2);
  const std::vector<std::tuple<int64_t, int, int>> shapes = {
      {1, 1, 2}, {9, 3, 8}, {13, 2, 10}, {70, 4, 64}, {11, 1, 128}};
  for (auto [T, H, hd] : shapes) {
    const std::string at =
        " T=" + std::to_string(T) + " H=" + std::to_string(H) + " hd=" + std::to_string(hd);
    std::vector<int32_t> pos(sz(T)), row(sz(T)), col(sz(T));
    // Positions up to 1e5, where the angle must be computed in double.
    for (auto& p : pos) p = int32_t(rng.below(100000));
    for (auto& r : row) r = int32_t(rng.below(64));
    for (auto& c : col) c = int32_t(rng.below(64));
    const auto x0 = random_vec(rng, sz(T * H * hd));
    for (int kind = 0; kind < 4; ++kind) {
      if (kind >= 2 && hd % 4) continue;  // 2-D RoPE needs an even half
      const double theta = kind < 2 ? 10000.0 : 100.0;
      const float sign = kind % 2 == 0 ? 1.0f : -1.0f;
      auto x = x0, e = x0;
      if (kind < 2) {
        if (kind == 0) cpu::rope_forward(x.data(), pos.data(), T, H, hd, 0, hd, theta);
        if (kind == 1) cpu::rope_backward(x.data(), pos.data(), T, H, hd, 0, hd, theta);
        rope_run(e.data(), pos.data(), T, H, hd, 0, hd, theta, sign);
      } else {
        if (kind == 2) cpu::rope2d_forward(x.data(), row.data(), col.data(), T, H, hd, theta);
        if (kind == 3) cpu::rope2d_backward(x.data(), row.data(), col.data(), T, H, hd, theta);
        rope_run(e.data(), row.data(), T, H, hd, 0, hd / 2, theta, sign);
        rope_run(e.data(), col.data(), T, H, hd, hd / 2, hd / 2, theta, sign);
      }
      // Same double angles and float rotation as the CPU.
      expect_close("rope kind " + std::to_string(kind) + at, e, x, kPointwise);
    }
  }
}

// ---- Activations --------------------------------------------------------------------------

TEST(CudaEmulated, Activations) {
  Rng rng(3);
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(255), int64_t(256), int64_t(257), int64_t(1000),
                    int64_t(4097)}) {
    const std::string at = " n=" + std::to_string(n);
    auto a = random_vec(rng, sz(n), 4.0f), b = random_vec(rng, sz(n), 4.0f);
    auto dh = random_vec(rng, sz(n));
    std::vector<float> h(sz(n)), da(sz(n)), db(sz(n)), y(sz(n)), dx(sz(n));
    cpu::swiglu_forward(h.data(), a.data(), b.data(), n);
    cpu::swiglu_backward(da.data(), db.data(), dh.data(), a.data(), b.data(), n);
    cpu::gelu_forward(y.data(), a.data(), n);
    cpu::gelu_backward(dx.data(), dh.data(), a.data(), n);
    std::vector<float> eh(sz(n), 7.0f), eda(sz(n), 7.0f), edb(sz(n), 7.0f), ey(sz(n), 7.0f),
        edx(sz(n), 7.0f);
    const LaunchDims l = cuda::act::launch(n);
    run(l, 0, [&](float*) { cuda::act::swiglu_forward_block(eh.data(), a.data(), b.data(), n); });
    run(l, 0, [&](float*) {
      cuda::act::swiglu_backward_block(eda.data(), edb.data(), dh.data(), a.data(), b.data(), n);
    });
    run(l, 0, [&](float*) { cuda::act::gelu_forward_block(ey.data(), a.data(), n); });
    run(l, 0, [&](float*) { cuda::act::gelu_backward_block(edx.data(), dh.data(), a.data(), n); });
    expect_close("swiglu h" + at, eh, h, kPointwise);
    expect_close("swiglu da" + at, eda, da, kPointwise);
    expect_close("swiglu db" + at, edb, db, kPointwise);
    expect_close("gelu y" + at, ey, y, kPointwise);
    expect_close("gelu dx" + at, edx, dx, kPointwise);
    // da may alias dh (the model reuses the buffer).
    auto g = dh;
    run(l, 0, [&](float*) {
      cuda::act::swiglu_backward_block(g.data(), edb.data(), g.data(), a.data(), b.data(), n);
    });
    expect_close("swiglu da aliasing dh" + at, g, da, kPointwise);
  }
}

// ---- Cross-entropy ------------------------------------------------------------------------

TEST(CudaEmulated, CrossEntropy) {
  Rng rng(4);
  // V = 1000, 2052, 512 and 4 take the vector path of the backward pass, the others the scalar one.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 2}, {17, 23}, {6, 1000}, {5, 2052}, {9, 1537}, {3, 512}, {4, 4}};
  for (auto [T, V] : shapes) {
    const std::string at = " T=" + std::to_string(T) + " V=" + std::to_string(V);
    auto logits = random_vec(rng, sz(T * V), 8.0f);
    std::vector<int32_t> targets(sz(T));
    for (auto& t : targets) t = rng.below(5) == 0 ? -1 : int32_t(rng.below(uint64_t(V)));
    // Some rows whose argmax is the target, so "correct" is exercised, and a tie for the max
    // (the first index wins, as on the CPU).
    for (int64_t t = 0; t < T; t += 3)
      if (targets[sz(t)] >= 0) logits[sz(t * V + targets[sz(t)])] = 20.0f;
    if (V > 1) logits[sz(V - 1)] = logits[0] = 25.0f;
    std::vector<float> lse(sz(T));
    const CrossEntropyStats st0{1.5, 2.0, 1.0};  // the op adds to what is there
    CrossEntropyStats st = st0;
    const CrossEntropyStats add =
        cpu::cross_entropy_forward(lse.data(), logits.data(), targets.data(), T, V);
    st.loss_sum += add.loss_sum, st.count += add.count, st.correct += add.correct;

    // One chunk of the launcher's loop (T < kCrossEntropyRows).
    std::vector<float> e_lse(sz(T), 7.0f);
    std::vector<cuda::CrossEntropyRow> rows(sz(T), cuda::CrossEntropyRow{7.0, 7, 7});
    run(cuda::xent::rows_launch(T), emu::floats_for<cuda::xent::Online[cuda::kWarp]>(),
        [&](float* s) {
          cuda::xent::forward_block(e_lse.data(), rows.data(), logits.data(), targets.data(), V,
                                    &shared_as<cuda::xent::Online>(s));
        });
    CrossEntropyStats est = st0;
    run(cuda::xent::stats_launch(), emu::floats_for<double[cuda::kWarp]>(),
        [&](float* s) { cuda::xent::stats_block(&est, rows.data(), T, &shared_as<double>(s)); });
    // Float exponentials summed per thread, then combined: ~1e-6 from the CPU's double sum.
    expect_close("lse" + at, e_lse, lse, Tol{1e-5, 1e-6});
    EXPECT_NEAR(est.loss_sum, st.loss_sum, 1e-5 * double(T)) << at;  // T rows of lse error
    EXPECT_EQ(est.count, st.count) << at;
    EXPECT_EQ(est.correct, st.correct) << at;
    // The statistics kernel on its own: a fixed-order double sum of the rows it was given.
    double loss = st0.loss_sum, mag = std::abs(st0.loss_sum);
    for (const auto& r : rows) loss += r.loss, mag += std::abs(r.loss);
    EXPECT_NEAR(est.loss_sum, loss, double(T + 32) * 0x1p-53 * mag) << at;

    // Backward from the CPU's lse, in place as the model calls it, and out of place from a
    // base one float off 16-byte alignment (the scalar path).
    std::vector<float> dl(sz(T * V));
    cpu::cross_entropy_backward(dl.data(), logits.data(), lse.data(), targets.data(), T, V, 0.25f);
    auto in_place = logits;
    float* d = in_place.data();
    const bool vec4 = cuda::xent::backward_vec4(d, d, V);
    EXPECT_EQ(vec4, V % 4 == 0) << at;
    run(cuda::xent::rows_launch(T), 0, [&](float*) {
      cuda::xent::backward_block(d, d, lse.data(), targets.data(), V, 0.25f, vec4);
    });
    // Same float expressions as the CPU (exp(x - lse) times scale, minus scale at the target).
    expect_close("dlogits in place" + at, in_place, dl, kPointwise);
    std::vector<float> shifted(sz(T * V) + 1, 7.0f);
    float* ds = shifted.data() + 1;
    const bool vec4_shifted = cuda::xent::backward_vec4(ds, logits.data(), V);
    EXPECT_FALSE(vec4_shifted) << at;
    run(cuda::xent::rows_launch(T), 0, [&](float*) {
      cuda::xent::backward_block(ds, logits.data(), lse.data(), targets.data(), V, 0.25f,
                                 vec4_shifted);
    });
    expect_close("dlogits misaligned" + at, std::vector<float>(ds, ds + T * V), dl, kPointwise);
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

// ---- Embedding, rows, patch merge ---------------------------------------------------------

TEST(CudaEmulated, Embedding) {
  Rng rng(5);
  // T > 256 takes the backward pass through several tiles of matches (V = 1: one id matches
  // every row, one more than a tile); C > 256 strides columns.
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 1, 1}, {50, 7, 5}, {300, 33, 20}, {40, 300, 3}, {256, 4, 2}, {257, 3, 1}};
  for (auto [T, C, V] : shapes) {
    const std::string at = " T=" + std::to_string(T) + " C=" + std::to_string(C);
    std::vector<int32_t> ids(sz(T));
    // Few distinct ids: many repeats, so the backward's ordering is exercised; some -1.
    for (auto& id : ids) id = rng.below(7) == 0 ? -1 : int32_t(rng.below(uint64_t(V)));
    auto table = random_vec(rng, sz(V * C)), dout = random_vec(rng, sz(T * C));
    auto dt0 = random_vec(rng, sz(V * C));
    std::vector<float> out(sz(T * C)), dt = dt0;
    cpu::embedding_forward(out.data(), ids.data(), table.data(), T, C);
    cpu::embedding_backward(dt.data(), dout.data(), ids.data(), T, C);
    std::vector<float> eout(out.size(), 7.0f), edt = dt0;
    run(cuda::embed::rows_launch(T), 0,
        [&](float*) { cuda::embed::forward_block(eout.data(), ids.data(), table.data(), C); });
    run(cuda::embed::rows_launch(T), emu::floats_for<cuda::embed::BackwardShared>(), [&](float* s) {
      cuda::embed::backward_block(edt.data(), dout.data(), ids.data(), T, C,
                                  shared_as<cuda::embed::BackwardShared>(s));
    });
    expect_close("embedding out" + at, eout, out, kExact);
    // Each table row adds its tokens' rows in token order, as on the CPU: the same sums.
    expect_close("embedding dtable" + at, edt, dt, kExact);
  }
}

TEST(CudaEmulated, RowsScatterGather) {
  Rng rng(6);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {40, 9}, {33, 300}};
  for (auto [T, C] : shapes) {
    const std::string at = " T=" + std::to_string(T) + " C=" + std::to_string(C);
    const int64_t rows = T / 2 + 1;
    std::vector<int32_t> slot(sz(T), -1), perm(sz(rows));
    for (int64_t i = 0; i < rows; ++i) perm[sz(i)] = int32_t(i);
    for (int64_t i = rows - 1; i > 0; --i) std::swap(perm[sz(i)], perm[rng.below(uint64_t(i + 1))]);
    for (int64_t i = 0, t = 0; i < rows && t < T; ++i, t += 2) slot[sz(t)] = perm[sz(i)];
    auto src = random_vec(rng, sz(rows * C)), y0 = random_vec(rng, sz(T * C));
    auto dy = random_vec(rng, sz(T * C)), ds0 = random_vec(rng, sz(rows * C));
    auto y = y0, ds = ds0, ey = y0, eds = ds0;
    cpu::scatter_rows(y.data(), src.data(), slot.data(), T, C);
    cpu::gather_rows(ds.data(), dy.data(), slot.data(), T, C);
    run(cuda::ew::rows_launch(T), 0,
        [&](float*) { cuda::ew::copy_rows_block(ey.data(), src.data(), slot.data(), C, true); });
    run(cuda::ew::rows_launch(T), 0,
        [&](float*) { cuda::ew::copy_rows_block(eds.data(), dy.data(), slot.data(), C, false); });
    expect_close("scatter_rows" + at, ey, y, kExact);
    expect_close("gather_rows" + at, eds, ds, kExact);
  }
}

TEST(CudaEmulated, PatchMerge) {
  Rng rng(7);
  for (int m : {1, 2, 3}) {
    std::vector<MergeImage> images;
    int64_t P = 0;
    // Grids in merged blocks; the patch grid is m times larger. 6 x 15 at m = 3 has more
    // patches than the kernel's slices per image, so slices take several.
    const std::vector<std::pair<int, int>> grids = {{1, 2}, {3, 3}, {6, 15}};
    for (auto [gh, gw] : grids) {
      images.push_back(MergeImage{P, gh * m, gw * m});
      P += int64_t(gh * m) * (gw * m);
    }
    const int n = int(images.size());
    for (int64_t C : {int64_t(5), int64_t(260)}) {
      const std::string at = " m=" + std::to_string(m) + " C=" + std::to_string(C);
      auto in = random_vec(rng, sz(P * C)), dout = random_vec(rng, sz(P * C));
      std::vector<float> out(sz(P * C)), din(sz(P * C));
      cpu::patch_merge_forward(out.data(), in.data(), images.data(), n, C, m);
      cpu::patch_merge_backward(din.data(), dout.data(), images.data(), n, C, m);
      std::vector<float> eout(out.size(), 7.0f), edin(din.size(), 7.0f);
      run(cuda::merge::launch(n), 0, [&](float*) {
        cuda::merge::merge_block<true>(eout.data(), in.data(), images.data(), C, m);
      });
      run(cuda::merge::launch(n), 0, [&](float*) {
        cuda::merge::merge_block<false>(edin.data(), dout.data(), images.data(), C, m);
      });
      expect_close("patch_merge out" + at, eout, out, kExact);
      expect_close("patch_merge din" + at, edin, din, kExact);
    }
  }
}

// ---- Vector ops, bias, AdamW --------------------------------------------------------------

// add_inplace as the launcher dispatches it.
void add_run(float* y, const float* x, int64_t n) {
  if (cuda::ew::add_vec4(y, x, n)) {
    run(cuda::ew::launch(n / 4), 0, [&](float*) {
      cuda::ew::add4_block(reinterpret_cast<float4*>(y), reinterpret_cast<const float4*>(x), n / 4);
    });
  } else {
    run(cuda::ew::launch(n), 0, [&](float*) { cuda::ew::add_block(y, x, n); });
  }
}

TEST(CudaEmulated, VectorOps) {
  Rng rng(8);
  for (int64_t n : {int64_t(1), int64_t(5), int64_t(1024), int64_t(4099), int64_t(4100)}) {
    const std::string at = " n=" + std::to_string(n);
    auto y0 = random_vec(rng, sz(n) + 1), x = random_vec(rng, sz(n) + 1);
    // At offset 0 (the vector path when n % 4 == 0) and one float off alignment (scalar).
    for (int64_t off : {int64_t(0), int64_t(1)}) {
      auto y = y0, e = y0;
      cpu::add_inplace(y.data() + off, x.data() + off, n);
      add_run(e.data() + off, x.data() + off, n);
      expect_close("add off=" + std::to_string(off) + at, e, y, kExact);
    }
    auto y = y0, e = y0;
    cpu::scale_inplace(y.data(), 0.37f, n);
    run(cuda::ew::launch(n), 0, [&](float*) { cuda::ew::scale_block(e.data(), 0.37f, n); });
    expect_close("scale" + at, e, y, kExact);
    cpu::fill(y.data(), -2.5f, n);
    run(cuda::ew::launch(n), 0, [&](float*) { cuda::ew::fill_block(e.data(), -2.5f, n); });
    expect_close("fill" + at, e, y, kExact);
  }
}

// The first stage always runs kSumSquaresBlocks blocks of 256 threads (about 3 s of fibers), so
// one size: past one element per thread, so threads take one or two and blocks end unevenly.
TEST(CudaEmulated, SumSquares) {
  Rng rng(9);
  const int64_t n = int64_t(cuda::kSumSquaresBlocks) * cuda::ew::kThreads + 1001;
  const auto x = random_vec(rng, sz(n));
  std::vector<double> partial(cuda::kSumSquaresBlocks, 7.0);
  double got = 7.0;
  run(cuda::ew::sum_squares_launch(), emu::floats_for<double[cuda::kWarp]>(), [&](float* s) {
    cuda::ew::sum_squares_partial_block(partial.data(), x.data(), n, &shared_as<double>(s));
  });
  run(cuda::ew::partials_launch(), emu::floats_for<double[cuda::kWarp]>(), [&](float* s) {
    cuda::ew::sum_partials_block(&got, partial.data(), cuda::kSumSquaresBlocks,
                                 &shared_as<double>(s));
  });
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

// adamw_update as the launcher splits it: whole 16-byte vectors, then the scalar rest.
void adamw_run(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  const cuda::adamw::Args a = cuda::adamw::args_of(s);
  const int64_t done = cuda::adamw::vector_part(p, g, m, v, n);
  if (done > 0)
    run(cuda::adamw::launch(done / 4), 0, [&](float*) {
      cuda::adamw::update4_block(reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
                                 reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v),
                                 done / 4, a);
    });
  if (done < n)
    run(cuda::adamw::launch(n - done), 0, [&](float*) {
      cuda::adamw::update_block(p + done, g + done, m + done, v + done, n - done, a);
    });
}

TEST(CudaEmulated, AdamW) {
  Rng rng(11);
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1001)}) {
    for (int64_t off : {int64_t(0), int64_t(1)}) {  // vectors and a tail, or all scalar
      const std::string at = " n=" + std::to_string(n) + " off=" + std::to_string(off);
      auto p = random_vec(rng, sz(n + off)), g = random_vec(rng, sz(n + off));
      auto m = random_vec(rng, sz(n + off), 0.1f), v = random_vec(rng, sz(n + off), 0.1f);
      for (auto& e : v) e = std::abs(e);
      auto ep = p, em = m, ev = v;
      for (int64_t t = 1; t <= 3; ++t) {
        const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, t == 2 ? 0.0f : 0.1f, t};
        cpu::adamw_update(p.data() + off, g.data() + off, m.data() + off, v.data() + off, n, s);
        adamw_run(ep.data() + off, g.data() + off, em.data() + off, ev.data() + off, n, s);
      }
      // The same float formula with the same host-rounded bias corrections.
      expect_close("adamw p" + at, ep, p, kPointwise);
      expect_close("adamw m" + at, em, m, kPointwise);
      expect_close("adamw v" + at, ev, v, kPointwise);
    }
  }
}


// ---- bf16 storage -------------------------------------------------------------------------

using cuda::bf16;

std::vector<bf16> to_bf16(const std::vector<float>& x) { return testing::stored<bf16>(x); }
std::vector<float> widen(const std::vector<bf16>& x) { return testing::widened(x); }

Act act(std::vector<bf16>& x) { return Act(x.data(), DType::BF16); }

// Each kernel body with bf16 storage against the CPU's bf16 staging (kernels/cpu/staged_ops.h:
// the fp32 reference kernels between the same roundings), on the same bf16 inputs. Both round
// an fp32 result once; the two fp32 results differ in their last bits, which moves a stored
// value by at most one bf16 step (2^-7 relative at most). fp32 outputs (statistics, dw) differ
// as in the fp32 tests.
TEST(CudaEmulated, Bf16StorageMatchesTheCpuStaging) {
  BackendOptions opt;
  opt.precision = Precision::bf16;
  auto cpu = make_cpu_backend(opt);
  const Ops& ref = cpu->ops();
  ASSERT_EQ(ref.dtype(), DType::BF16);
  const Tol kStep{1e-6, 0x1p-7 + 1e-6};
  Rng rng(77);
  const int64_t T = 37, C = 300, F = 1000;

  // RMSNorm.
  auto x = to_bf16(random_vec(rng, sz(T * C))), w = to_bf16(random_vec(rng, sz(C)));
  auto dy = to_bf16(random_vec(rng, sz(T * C)));
  std::vector<bf16> y(x.size()), ey(x.size(), cuda::st<bf16>(7.0f)), dx(x.size()),
      edx(x.size(), cuda::st<bf16>(7.0f));
  std::vector<float> rstd(sz(T)), er(sz(T)), dw(sz(C), 0.0f), edw(sz(C), 0.0f);
  ref.rmsnorm_forward(act(y), rstd.data(), act(x), act(w), T, C);
  ref.rmsnorm_backward(act(dx), dw.data(), act(dy), act(x), act(w), rstd.data(), T, C);
  run_rmsnorm(ey.data(), er.data(), edx.data(), edw.data(), x.data(), w.data(), dy.data(),
              rstd.data(), T, C);
  expect_close("bf16 rmsnorm rstd", er, rstd, Tol{1e-6, 1e-5});
  expect_close("bf16 rmsnorm y", widen(ey), widen(y), kStep);
  // dx subtracts a row mean: near-zero values carry the mean's fp32 error, sqrt(C)·eps.
  expect_close("bf16 rmsnorm dx", widen(edx), widen(dx), Tol{1e-6 * std::sqrt(double(C)), 0x1p-7});
  expect_close("bf16 rmsnorm dw", edw, dw, Tol{1e-5, 1e-5});

  // RoPE, in place.
  {
    const int H = 3, hd = 64;
    std::vector<int32_t> pos(sz(T));
    for (auto& p : pos) p = int32_t(rng.below(5000));
    auto q = to_bf16(random_vec(rng, sz(T * H * hd)));
    auto eq = q;
    ref.rope_forward(act(q), pos.data(), T, H, hd, 10000.0);
    run(cuda::rope::launch(T * hd / 2), 0, [&](float*) {
      cuda::rope::rotate_block(eq.data(), pos.data(), T, H, hd, 0, hd, 10000.0, 1.0f);
    });
    expect_close("bf16 rope", widen(eq), widen(q), kStep);
  }

  // SwiGLU and GELU.
  {
    const int64_t n = T * F;
    auto a = to_bf16(random_vec(rng, sz(n), 4.0f)), b = to_bf16(random_vec(rng, sz(n), 4.0f));
    auto dh = to_bf16(random_vec(rng, sz(n)));
    std::vector<bf16> h(sz(n)), da(sz(n)), db(sz(n)), g(sz(n)), dg(sz(n));
    std::vector<bf16> eh(sz(n)), eda(sz(n)), edb(sz(n)), eg(sz(n)), edg(sz(n));
    ref.swiglu_forward(act(h), act(a), act(b), n);
    ref.swiglu_backward(act(da), act(db), act(dh), act(a), act(b), n);
    ref.gelu_forward(act(g), act(a), n);
    ref.gelu_backward(act(dg), act(dh), act(a), n);
    const LaunchDims l = cuda::act::launch(n);
    run(l, 0, [&](float*) { cuda::act::swiglu_forward_block(eh.data(), a.data(), b.data(), n); });
    run(l, 0, [&](float*) {
      cuda::act::swiglu_backward_block(eda.data(), edb.data(), dh.data(), a.data(), b.data(), n);
    });
    run(l, 0, [&](float*) { cuda::act::gelu_forward_block(eg.data(), a.data(), n); });
    run(l, 0, [&](float*) { cuda::act::gelu_backward_block(edg.data(), dh.data(), a.data(), n); });
    expect_close("bf16 swiglu h", widen(eh), widen(h), kStep);
    expect_close("bf16 swiglu da", widen(eda), widen(da), kStep);
    expect_close("bf16 swiglu db", widen(edb), widen(db), kStep);
    expect_close("bf16 gelu y", widen(eg), widen(g), kStep);
    expect_close("bf16 gelu dx", widen(edg), widen(dg), kStep);
  }

  // Cross-entropy: lse and the statistics from bf16 logits, the gradient in place.
  {
    const int64_t V = 203;
    auto logits = to_bf16(random_vec(rng, sz(T * V), 8.0f));
    std::vector<int32_t> targets(sz(T));
    for (auto& t : targets) t = rng.below(5) == 0 ? -1 : int32_t(rng.below(uint64_t(V)));
    std::vector<float> lse(sz(T)), glse(sz(T));
    CrossEntropyStats st{};
    ref.cross_entropy_forward(lse.data(), &st, act(logits), targets.data(), T, V);
    std::vector<cuda::CrossEntropyRow> rows(sz(T));
    run(cuda::xent::rows_launch(T), emu::floats_for<cuda::xent::Online[cuda::kWarp]>(),
        [&](float* s) {
          cuda::xent::forward_block(glse.data(), rows.data(), logits.data(), targets.data(), V,
                                    &shared_as<cuda::xent::Online>(s));
        });
    expect_close("bf16 cross-entropy lse", glse, lse, Tol{1e-5, 1e-6});
    auto d = logits, ed = logits;
    ref.cross_entropy_backward(act(d), act(d), lse.data(), targets.data(), T, V, 0.25f);
    EXPECT_FALSE(cuda::xent::backward_vec4(ed.data(), ed.data(), V));
    run(cuda::xent::rows_launch(T), 0, [&](float*) {
      cuda::xent::backward_block(ed.data(), ed.data(), lse.data(), targets.data(), V, 0.25f,
                                 false);
    });
    // At the target p - scale cancels: scale·1e-5 absolute on top of the rounding step.
    expect_close("bf16 cross-entropy dlogits", widen(ed), widen(d), Tol{3e-6, 0x1p-7 + 1e-5});
  }

  // Embedding rows are copied as they are; their gradient lands in fp32.
  {
    const int64_t V = 50;
    std::vector<int32_t> ids(sz(T));
    for (auto& id : ids) id = rng.below(7) == 0 ? -1 : int32_t(rng.below(uint64_t(V)));
    auto table = to_bf16(random_vec(rng, sz(V * C))), dout = to_bf16(random_vec(rng, sz(T * C)));
    std::vector<bf16> out(sz(T * C)), eout(sz(T * C), cuda::st<bf16>(7.0f));
    std::vector<float> dt(sz(V * C), 0.0f), edt(sz(V * C), 0.0f);
    ref.embedding_forward(act(out), ids.data(), act(table), T, C);
    ref.embedding_backward(dt.data(), act(dout), ids.data(), T, C);
    run(cuda::embed::rows_launch(T), 0,
        [&](float*) { cuda::embed::forward_block(eout.data(), ids.data(), table.data(), C); });
    run(cuda::embed::rows_launch(T), emu::floats_for<cuda::embed::BackwardShared>(),
        [&](float* s) {
          cuda::embed::backward_block(edt.data(), dout.data(), ids.data(), T, C,
                                      shared_as<cuda::embed::BackwardShared>(s));
        });
    expect_close("bf16 embedding out", widen(eout), widen(out), kExact);
    expect_close("bf16 embedding dtable", edt, dt, kExact);
  }

  // Pixels: the fp32 values are the CPU's bits (the same IEEE operations), stored in bf16.
  {
    const PixelNorm norm{{0.48f, 0.45f, 0.40f}, {0.27f, 0.26f, 0.28f}};
    std::vector<uint8_t> px(sz(3 * 1000 + 1));
    for (auto& p : px) p = uint8_t(rng.below(256));
    const int64_t n = int64_t(px.size());
    std::vector<float> want(px.size()), got(px.size(), 7.0f);
    cpu::normalize_pixels(want.data(), px.data(), n, norm);
    run(cuda::pixels::launch(n), 0,
        [&](float*) { cuda::pixels::normalize_block(got.data(), px.data(), n, norm); });
    expect_close("pixels fp32", got, want, kExact);
    std::vector<bf16> h(px.size()), e(px.size());
    ref.normalize_pixels(act(h), px.data(), n, norm);
    run(cuda::pixels::launch(n), 0,
        [&](float*) { cuda::pixels::normalize_block(e.data(), px.data(), n, norm); });
    expect_close("pixels bf16", widen(e), widen(h), kExact);
  }

  // Residual add, fill, the weights' cast, row copies and the bias gradient's column sums.
  {
    auto a = to_bf16(random_vec(rng, sz(T * C))), b = to_bf16(random_vec(rng, sz(T * C)));
    auto ea = a;
    ref.add_inplace(act(a), act(b), T * C);
    run(cuda::ew::launch(T * C), 0, [&](float*) { cuda::ew::add_block(ea.data(), b.data(), T * C); });
    expect_close("bf16 add", widen(ea), widen(a), kExact);  // one fp32 add, one rounding
    auto acc = random_vec(rng, sz(T * C));
    auto eacc = acc;
    ref.accumulate(acc.data(), act(b), T * C);
    run(cuda::ew::launch(T * C), 0,
        [&](float*) { cuda::ew::accumulate_block(eacc.data(), b.data(), T * C); });
    expect_close("bf16 into fp32 accumulate", eacc, acc, kExact);
    const auto master = random_vec(rng, sz(T * C));
    std::vector<bf16> cast(sz(T * C)), ecast(sz(T * C));
    ref.cast(act(cast), master.data(), T * C);
    run(cuda::ew::launch(T * C), 0,
        [&](float*) { cuda::ew::cast_block(ecast.data(), master.data(), T * C); });
    expect_close("bf16 cast", widen(ecast), widen(cast), kExact);
    for (size_t i = 0; i < master.size(); ++i)
      ASSERT_LE(std::abs(cuda::ld(ecast[i]) - master[i]), 0x1p-8 * std::abs(master[i]) + 1e-30)
          << "cast is not round-to-nearest at " << i;
    std::vector<bf16> f(sz(T * C)), ef(sz(T * C));
    ref.fill(act(f), 0.1f, T * C);
    run(cuda::ew::launch(T * C), 0, [&](float*) { cuda::ew::fill_block(ef.data(), 0.1f, T * C); });
    expect_close("bf16 fill", widen(ef), widen(f), kExact);
    std::vector<int32_t> slot(sz(T), -1);
    for (int64_t t = 0; t < T; t += 3) slot[sz(t)] = int32_t(t / 3);
    std::vector<bf16> rows = to_bf16(random_vec(rng, sz((T / 3 + 1) * C)));
    auto sy = a, esy = a;
    ref.scatter_rows(act(sy), act(rows), slot.data(), T, C);
    run(cuda::ew::rows_launch(T), 0,
        [&](float*) { cuda::ew::copy_rows_block(esy.data(), rows.data(), slot.data(), C, true); });
    expect_close("bf16 scatter_rows", widen(esy), widen(sy), kExact);
    std::vector<float> db(sz(C), 0.5f), edb(sz(C), 0.5f);
    // The bias gradient only: no dx, so no W; no dW, so no x.
    ref.linear_backward(Act(), nullptr, db.data(), act(b), CAct(), CAct(), T, C, C, false);
    run(cuda::ew::columns_launch(C), emu::floats_for<cuda::ew::ColumnShared>(), [&](float* s) {
      cuda::ew::column_sum_block(edb.data(), b.data(), T, C, shared_as<cuda::ew::ColumnShared>(s));
    });
    expect_close("bf16 bias gradient", edb, db, Tol{1e-5, 1e-5});
  }
}

}  // namespace
}  // namespace dhp
