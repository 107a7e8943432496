// Every CUDA op against the CPU reference on fresh random inputs (several shapes, odd sizes
// included), forward and backward, and one full training step of a small model on both
// backends. Each comparison allows atol + rtol·|ref| with its reason beside it. Without a
// usable device every test is skipped (ctest shows it as skipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device.h"
#include "tests/expect_close.h"
#include "tests/grad_check.h"
#include "tests/model_fixtures.h"

namespace dhp {
namespace {

using testing::random_vec;

using testing::Tol;

// Same float operations in the same order; the bound absorbs fused multiply-adds and the
// device's expf/tanhf (2 ulp), which GELU's derivative amplifies ~10x at |x| = 4 where
// 1 - tanh² cancels.
constexpr Tol kPointwise{1e-5, 1e-5};
// Pure copies and permutations: bit for bit.
constexpr Tol kExact{0.0, 0.0};
// Row reductions summed in float on the device, in double on the CPU: ~sqrt(C)·eps apart.
constexpr Tol kRowReduce{1e-5, 1e-5};

template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref,
                  Tol tol) {
  testing::expect_close(what, got, ref, tol, "cuda");
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaStatus st = cuda_status();
    if (st.devices == 0) GTEST_SKIP() << "no usable CUDA device: " << st.reason;
    gpu_ = make_cuda_backend(BackendOptions{});
    cpu_ = make_cpu_backend(BackendOptions{});
  }

  template <class T>
  DeviceBuffer put(const std::vector<T>& v) {
    DeviceBuffer d(*gpu_, sizeof(T) * std::max<size_t>(v.size(), 1));
    gpu_->upload(d.data(), v.data(), sizeof(T) * v.size());
    return d;
  }
  template <class T>
  std::vector<T> get(const DeviceBuffer& d, size_t n) {
    std::vector<T> v(n);
    gpu_->download(v.data(), d.data(), sizeof(T) * n);
    return v;
  }
  const Ops& g() const { return gpu_->ops(); }
  const Ops& c() const { return cpu_->ops(); }

  std::unique_ptr<Backend> gpu_, cpu_;
  Rng rng_{20251130};
};

// ---- Linear (cuBLASLt) -------------------------------------------------------------------

struct LinearCase {
  int64_t T, in, out;
};
const LinearCase kLinearCases[] = {{1, 1, 1}, {7, 13, 5}, {33, 64, 96}, {130, 257, 63},
                                   {256, 512, 1024}};

// Unit roundoff of a precision's products: fp32 as it is; TF32 keeps 10 mantissa bits, BF16 7.
double unit(const std::string& precision) {
  return precision == "fp32" ? 6e-8 : precision == "tf32" ? 4.9e-4 : 3.9e-3;
}

// Inputs in [-1, 1]: rounding the inputs costs ~sqrt(K)·u/5 rms on a length-K dot product
// (random signs), and up to 2u relative if the hardware truncates instead of rounding; hence
// 4·u·sqrt(K) + 4u·|ref|. fp32 accumulation in another order than OpenBLAS adds up to
// ~K·eps/4 on sums that grow like sqrt(K): 1e-7·K.
Tol gemm_tol(const std::string& precision, int64_t K) {
  const double u = unit(precision);
  return Tol{4.0 * u * std::sqrt(double(K)) + 1e-7 * double(K), 4.0 * u};
}

class CudaLinear : public CudaOpsTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(CudaLinear, ForwardAndBackwardMatchCpu) {
  const std::string precision = GetParam();
  BackendOptions opt;
  opt.precision = precision;
  gpu_ = make_cuda_backend(opt);
  for (const LinearCase& k : kLinearCases) {
    for (bool bias : {false, true}) {
      const std::string at = "T=" + std::to_string(k.T) + " in=" + std::to_string(k.in) +
                             " out=" + std::to_string(k.out) + (bias ? " bias " : " ") + precision;
      auto x = random_vec(rng_, k.T * k.in), W = random_vec(rng_, k.out * k.in);
      auto b = random_vec(rng_, k.out), dy = random_vec(rng_, k.T * k.out);
      auto dx0 = random_vec(rng_, k.T * k.in), dW0 = random_vec(rng_, k.out * k.in);
      auto db0 = random_vec(rng_, k.out);
      auto X = put(x), Wd = put(W), B = put(b), DY = put(dy);
      std::vector<float> y(k.T * k.out);
      c().linear_forward(y.data(), x.data(), W.data(), bias ? b.data() : nullptr, k.T, k.in, k.out);
      DeviceBuffer Y(*gpu_, sizeof(float) * y.size());
      g().linear_forward(Y.as<float>(), X.as<float>(), Wd.as<float>(), bias ? B.as<float>() : nullptr,
                         k.T, k.in, k.out);
      expect_close("y " + at, get<float>(Y, y.size()), y, gemm_tol(precision, k.in));

      for (bool acc : {false, true}) {
        auto dx = dx0, dW = dW0, db = db0;
        auto DX = put(dx0), DW = put(dW0), DB = put(db0);
        c().linear_backward(dx.data(), dW.data(), bias ? db.data() : nullptr, dy.data(), x.data(),
                            W.data(), k.T, k.in, k.out, acc);
        g().linear_backward(DX.as<float>(), DW.as<float>(), bias ? DB.as<float>() : nullptr,
                            DY.as<float>(), X.as<float>(), Wd.as<float>(), k.T, k.in, k.out, acc);
        const std::string a = at + (acc ? " accumulate" : "");
        expect_close("dx " + a, get<float>(DX, dx.size()), dx, gemm_tol(precision, k.out));
        expect_close("dW " + a, get<float>(DW, dW.size()), dW, gemm_tol(precision, k.T));
        // Column sums in fp32 whatever the precision: the same error model as an fp32 GEMM.
        expect_close("db " + a, get<float>(DB, db.size()), db, gemm_tol("fp32", k.T));
      }
    }
  }
  // A bias that is not 16-byte aligned is added in a separate pass.
  {
    const LinearCase k = kLinearCases[2];
    auto x = random_vec(rng_, k.T * k.in), W = random_vec(rng_, k.out * k.in);
    auto b = random_vec(rng_, k.out + 1);
    std::vector<float> y(k.T * k.out);
    c().linear_forward(y.data(), x.data(), W.data(), b.data() + 1, k.T, k.in, k.out);
    auto X = put(x), Wd = put(W), B = put(b);
    DeviceBuffer Y(*gpu_, sizeof(float) * y.size());
    g().linear_forward(Y.as<float>(), X.as<float>(), Wd.as<float>(), B.as<float>() + 1, k.T, k.in,
                       k.out);
    expect_close("y misaligned bias " + precision, get<float>(Y, y.size()), y,
                 gemm_tol(precision, k.in));
  }
  // dx may be skipped (the first layer's input needs no gradient).
  const LinearCase k = kLinearCases[2];
  auto x = random_vec(rng_, k.T * k.in), W = random_vec(rng_, k.out * k.in);
  auto dy = random_vec(rng_, k.T * k.out);
  std::vector<float> dW(k.out * k.in, 0.0f);
  auto X = put(x), Wd = put(W), DY = put(dy), DW = put(dW);
  c().linear_backward(nullptr, dW.data(), nullptr, dy.data(), x.data(), W.data(), k.T, k.in, k.out,
                      false);
  g().linear_backward(nullptr, DW.as<float>(), nullptr, DY.as<float>(), X.as<float>(),
                      Wd.as<float>(), k.T, k.in, k.out, false);
  expect_close("dW without dx " + precision, get<float>(DW, dW.size()), dW,
               gemm_tol(precision, k.T));
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaLinear, ::testing::Values("fp32", "tf32", "bf16"));

TEST_F(CudaOpsTest, GemmPlansAreCachedByShape) {
  const auto& ops = dynamic_cast<const CudaOps&>(g());
  auto x = put(random_vec(rng_, 8 * 16)), W = put(random_vec(rng_, 4 * 16));
  DeviceBuffer y(*gpu_, sizeof(float) * 8 * 4);
  ops.linear_forward(y.as<float>(), x.as<float>(), W.as<float>(), nullptr, 8, 16, 4);
  const size_t plans = ops.gemm_plans();
  for (int i = 0; i < 3; ++i)
    ops.linear_forward(y.as<float>(), x.as<float>(), W.as<float>(), nullptr, 8, 16, 4);
  EXPECT_EQ(ops.gemm_plans(), plans);
  ops.linear_forward(y.as<float>(), x.as<float>(), W.as<float>(), nullptr, 4, 16, 4);
  EXPECT_EQ(ops.gemm_plans(), plans + 1);
}

// ---- RMSNorm -----------------------------------------------------------------------------

TEST_F(CudaOpsTest, RmsNormMatchesCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {5, 7}, {64, 256}, {37, 1000}, {300, 2048}};
  for (auto [T, C] : shapes) {
    const std::string at = "T=" + std::to_string(T) + " C=" + std::to_string(C);
    auto x = random_vec(rng_, T * C), w = random_vec(rng_, C), dy = random_vec(rng_, T * C);
    auto dw0 = random_vec(rng_, C);
    std::vector<float> y(T * C), rstd(T), dx(T * C), dw = dw0;
    c().rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, C);
    c().rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, C);
    auto X = put(x), Wd = put(w), DY = put(dy), DW = put(dw0);
    DeviceBuffer Y(*gpu_, sizeof(float) * y.size()), R(*gpu_, sizeof(float) * T),
        DX(*gpu_, sizeof(float) * dx.size());
    g().rmsnorm_forward(Y.as<float>(), R.as<float>(), X.as<float>(), Wd.as<float>(), T, C);
    g().rmsnorm_backward(DX.as<float>(), DW.as<float>(), DY.as<float>(), X.as<float>(),
                         Wd.as<float>(), R.as<float>(), T, C);
    expect_close("rstd " + at, get<float>(R, T), rstd, kRowReduce);
    expect_close("y " + at, get<float>(Y, y.size()), y, kRowReduce);
    // dx subtracts a row mean of C products: absolute error ~ sqrt(C)·eps of O(1) terms.
    expect_close("dx " + at, get<float>(DX, dx.size()), dx, Tol{1e-5 * std::sqrt(double(C)), 1e-4});
    // dw: T terms summed in 16 interleaved lanes on the device, in row order on the CPU.
    expect_close("dw " + at, get<float>(DW, C), dw, Tol{1e-6 * double(T), 1e-4});
  }
}

// ---- RoPE ---------------------------------------------------------------------------------

TEST_F(CudaOpsTest, RopeMatchesCpu) {
  const std::vector<std::tuple<int64_t, int, int>> shapes = {{1, 1, 2}, {9, 3, 8}, {70, 4, 64}, {33, 2, 128}};
  for (auto [T, H, hd] : shapes) {
    const std::string at = "T=" + std::to_string(T) + " H=" + std::to_string(H) +
                           " hd=" + std::to_string(hd);
    std::vector<int32_t> pos(T), row(T), col(T);
    // Positions up to 1e5, where the angle must be computed in double.
    for (int64_t t = 0; t < T; ++t) pos[t] = int32_t(rng_.below(100000));
    for (int64_t t = 0; t < T; ++t) row[t] = int32_t(rng_.below(64)), col[t] = int32_t(rng_.below(64));
    const auto x0 = random_vec(rng_, T * H * hd);
    auto P = put(pos), Rw = put(row), Cl = put(col);
    // Same double angles and float rotation on both sides.
    const Tol tol{1e-6, 1e-5};
    for (int kind = 0; kind < 4; ++kind) {
      auto x = x0;
      auto X = put(x0);
      const double theta = kind < 2 ? 10000.0 : 100.0;
      switch (kind) {
        case 0:
          c().rope_forward(x.data(), pos.data(), T, H, hd, theta);
          g().rope_forward(X.as<float>(), P.as<int32_t>(), T, H, hd, theta);
          break;
        case 1:
          c().rope_backward(x.data(), pos.data(), T, H, hd, theta);
          g().rope_backward(X.as<float>(), P.as<int32_t>(), T, H, hd, theta);
          break;
        case 2:
          if (hd % 4) continue;
          c().rope2d_forward(x.data(), row.data(), col.data(), T, H, hd, theta);
          g().rope2d_forward(X.as<float>(), Rw.as<int32_t>(), Cl.as<int32_t>(), T, H, hd, theta);
          break;
        default:
          if (hd % 4) continue;
          c().rope2d_backward(x.data(), row.data(), col.data(), T, H, hd, theta);
          g().rope2d_backward(X.as<float>(), Rw.as<int32_t>(), Cl.as<int32_t>(), T, H, hd, theta);
      }
      expect_close("rope kind " + std::to_string(kind) + " " + at, get<float>(X, x.size()), x, tol);
    }
  }
}

// ---- Activations --------------------------------------------------------------------------

TEST_F(CudaOpsTest, ActivationsMatchCpu) {
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1000), int64_t(4097), int64_t(100003)}) {
    const std::string at = "n=" + std::to_string(n);
    auto a = random_vec(rng_, n, 4.0f), b = random_vec(rng_, n, 4.0f), dh = random_vec(rng_, n);
    std::vector<float> h(n), da(n), db(n), y(n), dx(n);
    c().swiglu_forward(h.data(), a.data(), b.data(), n);
    c().swiglu_backward(da.data(), db.data(), dh.data(), a.data(), b.data(), n);
    c().gelu_forward(y.data(), a.data(), n);
    c().gelu_backward(dx.data(), dh.data(), a.data(), n);
    auto A = put(a), B = put(b), DH = put(dh);
    DeviceBuffer H(*gpu_, 4 * n), DA(*gpu_, 4 * n), DB(*gpu_, 4 * n), Y(*gpu_, 4 * n),
        DX(*gpu_, 4 * n);
    g().swiglu_forward(H.as<float>(), A.as<float>(), B.as<float>(), n);
    g().swiglu_backward(DA.as<float>(), DB.as<float>(), DH.as<float>(), A.as<float>(),
                        B.as<float>(), n);
    g().gelu_forward(Y.as<float>(), A.as<float>(), n);
    g().gelu_backward(DX.as<float>(), DH.as<float>(), A.as<float>(), n);
    expect_close("swiglu h " + at, get<float>(H, n), h, kPointwise);
    expect_close("swiglu da " + at, get<float>(DA, n), da, kPointwise);
    expect_close("swiglu db " + at, get<float>(DB, n), db, kPointwise);
    expect_close("gelu y " + at, get<float>(Y, n), y, kPointwise);
    expect_close("gelu dx " + at, get<float>(DX, n), dx, kPointwise);
    // da may alias dh (the model reuses the buffer).
    g().swiglu_backward(DH.as<float>(), DB.as<float>(), DH.as<float>(), A.as<float>(),
                        B.as<float>(), n);
    expect_close("swiglu da aliasing dh " + at, get<float>(DH, n), da, kPointwise);
  }
}

// ---- Cross-entropy ------------------------------------------------------------------------

TEST_F(CudaOpsTest, CrossEntropyMatchesCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 2}, {17, 23}, {64, 1000}, {130, 32000}, {5000, 37}};
  for (auto [T, V] : shapes) {
    const std::string at = "T=" + std::to_string(T) + " V=" + std::to_string(V);
    auto logits = random_vec(rng_, T * V, 8.0f);
    std::vector<int32_t> targets(T);
    for (int64_t t = 0; t < T; ++t)
      targets[t] = rng_.below(5) == 0 ? -1 : int32_t(rng_.below(uint64_t(V)));
    // Some rows whose argmax is the target, so "correct" is exercised.
    for (int64_t t = 0; t < T; t += 3)
      if (targets[t] >= 0) logits[t * V + targets[t]] = 20.0f;
    std::vector<float> lse(T), dl(T * V);
    CrossEntropyStats st{1.5, 2.0, 1.0};  // the op adds to what is there
    c().cross_entropy_forward(lse.data(), &st, logits.data(), targets.data(), T, V);
    c().cross_entropy_backward(dl.data(), logits.data(), lse.data(), targets.data(), T, V, 0.25f);
    auto L = put(logits), Tg = put(targets);
    DeviceBuffer LSE(*gpu_, 4 * T);
    const CrossEntropyStats st0{1.5, 2.0, 1.0};
    DeviceBuffer S(*gpu_, sizeof(CrossEntropyStats));
    gpu_->upload(S.data(), &st0, sizeof(st0));
    g().cross_entropy_forward(LSE.as<float>(), S.as<CrossEntropyStats>(), L.as<float>(),
                              Tg.as<int32_t>(), T, V);
    // Float exponentials summed per thread, then combined: ~1e-6 from the CPU's double sum.
    expect_close("lse " + at, get<float>(LSE, T), lse, Tol{1e-5, 1e-6});
    CrossEntropyStats gs{};
    gpu_->download(&gs, S.data(), sizeof(gs));
    EXPECT_NEAR(gs.loss_sum, st.loss_sum, 1e-5 * double(T)) << at;  // T rows of lse error
    EXPECT_EQ(gs.count, st.count) << at;
    EXPECT_EQ(gs.correct, st.correct) << at;
    // In place, as the model calls it.
    g().cross_entropy_backward(L.as<float>(), L.as<float>(), LSE.as<float>(), Tg.as<int32_t>(), T,
                               V, 0.25f);
    // exp(x - lse) with the two lse up to 1e-5 apart: that relative error, and at the target,
    // where p - scale cancels, scale·1e-5 absolute.
    expect_close("dlogits " + at, get<float>(L, dl.size()), dl, Tol{3e-6, 1e-5});
  }
}

// ---- Embedding, rows, patch merge ---------------------------------------------------------

TEST_F(CudaOpsTest, EmbeddingMatchesCpu) {
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {{1, 1, 1}, {50, 7, 5}, {600, 64, 300}, {1000, 130, 20}};
  for (auto [T, C, V] : shapes) {
    const std::string at = "T=" + std::to_string(T) + " C=" + std::to_string(C);
    std::vector<int32_t> ids(T);
    // Few distinct ids: many repeats, so the backward's ordering is exercised; some -1.
    for (int64_t t = 0; t < T; ++t) ids[t] = rng_.below(7) == 0 ? -1 : int32_t(rng_.below(uint64_t(V)));
    auto table = random_vec(rng_, V * C), dout = random_vec(rng_, T * C), dt0 = random_vec(rng_, V * C);
    std::vector<float> out(T * C), dt = dt0;
    c().embedding_forward(out.data(), ids.data(), table.data(), T, C);
    c().embedding_backward(dt.data(), dout.data(), ids.data(), T, C);
    auto I = put(ids), Tb = put(table), DO = put(dout), DT = put(dt0);
    DeviceBuffer O(*gpu_, 4 * out.size());
    g().embedding_forward(O.as<float>(), I.as<int32_t>(), Tb.as<float>(), T, C);
    g().embedding_backward(DT.as<float>(), DO.as<float>(), I.as<int32_t>(), T, C);
    expect_close("embedding out " + at, get<float>(O, out.size()), out, kExact);
    // Each table row adds its tokens' rows in token order, as on the CPU: the same sums.
    expect_close("embedding dtable " + at, get<float>(DT, dt.size()), dt, kExact);
  }
}

TEST_F(CudaOpsTest, RowsScatterGatherMatchCpu) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {40, 9}, {513, 256}};
  for (auto [T, C] : shapes) {
    const int64_t rows = T / 2 + 1;
    std::vector<int32_t> slot(T, -1);
    std::vector<int32_t> perm(rows);
    for (int64_t i = 0; i < rows; ++i) perm[i] = int32_t(i);
    for (int64_t i = rows - 1; i > 0; --i) std::swap(perm[i], perm[rng_.below(uint64_t(i + 1))]);
    for (int64_t i = 0, t = 0; i < rows && t < T; ++i, t += 2) slot[t] = perm[i];
    auto src = random_vec(rng_, rows * C), y0 = random_vec(rng_, T * C);
    auto dy = random_vec(rng_, T * C), ds0 = random_vec(rng_, rows * C);
    auto y = y0, ds = ds0;
    c().scatter_rows(y.data(), src.data(), slot.data(), T, C);
    c().gather_rows(ds.data(), dy.data(), slot.data(), T, C);
    auto S = put(slot), Src = put(src), Y = put(y0), DY = put(dy), DS = put(ds0);
    g().scatter_rows(Y.as<float>(), Src.as<float>(), S.as<int32_t>(), T, C);
    g().gather_rows(DS.as<float>(), DY.as<float>(), S.as<int32_t>(), T, C);
    expect_close("scatter_rows", get<float>(Y, y.size()), y, kExact);
    expect_close("gather_rows", get<float>(DS, ds.size()), ds, kExact);
  }
}

TEST_F(CudaOpsTest, PatchMergeMatchesCpu) {
  for (int m : {1, 2, 3}) {
    std::vector<MergeImage> images;
    int64_t P = 0;
    // Grids in merged blocks; the patch grid is m times larger.
    const std::vector<std::pair<int, int>> grids = {{1, 2}, {3, 3}, {2, 1}, {6, 15}};
    for (auto [gh, gw] : grids) {
      images.push_back(MergeImage{P, gh * m, gw * m});
      P += int64_t(gh * m) * (gw * m);
    }
    const int64_t C = 5;
    auto in = random_vec(rng_, P * C), dout = random_vec(rng_, P * C);
    std::vector<float> out(P * C), din(P * C);
    c().patch_merge_forward(out.data(), in.data(), images.data(), int(images.size()), C, m);
    c().patch_merge_backward(din.data(), dout.data(), images.data(), int(images.size()), C, m);
    auto Im = put(images), In = put(in), DO = put(dout);
    DeviceBuffer O(*gpu_, 4 * out.size()), DI(*gpu_, 4 * din.size());
    g().patch_merge_forward(O.as<float>(), In.as<float>(), Im.as<MergeImage>(), int(images.size()),
                            C, m);
    g().patch_merge_backward(DI.as<float>(), DO.as<float>(), Im.as<MergeImage>(),
                             int(images.size()), C, m);
    expect_close("patch_merge out m=" + std::to_string(m), get<float>(O, out.size()), out, kExact);
    expect_close("patch_merge din m=" + std::to_string(m), get<float>(DI, din.size()), din, kExact);
  }
}

// ---- Vector ops and AdamW -----------------------------------------------------------------

TEST_F(CudaOpsTest, VectorOpsMatchCpu) {
  for (int64_t n : {int64_t(1), int64_t(5), int64_t(1024), int64_t(100001), int64_t(3000000)}) {
    const std::string at = "n=" + std::to_string(n);
    auto y0 = random_vec(rng_, n), x = random_vec(rng_, n);
    auto y = y0;
    c().add_inplace(y.data(), x.data(), n);
    auto Y = put(y0), X = put(x);
    g().add_inplace(Y.as<float>(), X.as<float>(), n);
    expect_close("add " + at, get<float>(Y, n), y, kExact);
    c().scale_inplace(y.data(), 0.37f, n);
    g().scale_inplace(Y.as<float>(), 0.37f, n);
    expect_close("scale " + at, get<float>(Y, n), y, kExact);
    double ref = 0.0;
    c().sum_squares(&ref, y.data(), n);
    DeviceBuffer D(*gpu_, sizeof(double));
    g().sum_squares(D.as<double>(), Y.as<float>(), n);
    // Both sum exact float squares in double, in different orders; the longest sequential run
    // (the CPU's 16384-element chunks) bounds the relative error by ~1e-12.
    EXPECT_NEAR(get<double>(D, 1)[0], ref, 1e-11 * ref) << at;
    // Deterministic: a second run gives the same bits.
    const double first = get<double>(D, 1)[0];
    g().sum_squares(D.as<double>(), Y.as<float>(), n);
    EXPECT_EQ(get<double>(D, 1)[0], first) << at;
    c().fill(y.data(), -2.5f, n);
    g().fill(Y.as<float>(), -2.5f, n);
    expect_close("fill " + at, get<float>(Y, n), y, kExact);
  }
  // Misaligned pointers take the scalar path.
  auto y0 = random_vec(rng_, 101), x = random_vec(rng_, 101);
  auto y = y0;
  c().add_inplace(y.data() + 1, x.data() + 1, 100);
  auto Y = put(y0), X = put(x);
  g().add_inplace(Y.as<float>() + 1, X.as<float>() + 1, 100);
  expect_close("add misaligned", get<float>(Y, 101), y, kExact);
}

TEST_F(CudaOpsTest, AdamWMatchesCpu) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(100003)}) {
    auto p = random_vec(rng_, n), gr = random_vec(rng_, n), m = random_vec(rng_, n, 0.1f);
    auto v = random_vec(rng_, n, 0.1f);
    for (auto& e : v) e = std::abs(e);
    auto P = put(p), G = put(gr), M = put(m), Vd = put(v);
    for (int64_t t = 1; t <= 3; ++t) {
      const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, t == 2 ? 0.0f : 0.1f, t};
      c().adamw_update(p.data(), gr.data(), m.data(), v.data(), n, s);
      g().adamw_update(P.as<float>(), G.as<float>(), M.as<float>(), Vd.as<float>(), n, s);
    }
    // Same float formula; fused multiply-adds on the device move the last bit or two.
    const Tol tol{1e-7, 1e-6};
    expect_close("adamw p", get<float>(P, n), p, tol);
    expect_close("adamw m", get<float>(M, n), m, tol);
    expect_close("adamw v", get<float>(Vd, n), v, tol);
  }
}

// ---- A full training step -----------------------------------------------------------------

TEST_F(CudaOpsTest, TrainingStepMatchesCpu) {
  ModelConfig cfg = testing::tiny_config();
  Model ref(cfg, *cpu_);
  testing::randomise(ref, 17);
  Model dev(cfg, *gpu_);
  dev.upload_params(ref.download_params());
  const Batch b = testing::make_batch(testing::sample_docs(), cfg, 3);
  const float scale = 1.0f / float(b.loss_tokens());
  ref.zero_grads();
  dev.zero_grads();
  const StepStats rs = ref.step(b, scale, true);
  const StepStats ds = dev.step(b, scale, true);
  // fp32 throughout; two layers of differently ordered sums leave ~1e-6 relative.
  EXPECT_NEAR(ds.loss_sum, rs.loss_sum, 1e-5 * std::abs(rs.loss_sum));
  EXPECT_EQ(ds.targets, rs.targets);
  EXPECT_EQ(ds.correct, rs.correct);
  const std::vector<float> rg(ref.grads(), ref.grads() + ref.n_params());
  std::vector<float> dg(dev.n_params());
  gpu_->download(dg.data(), dev.grads(), sizeof(float) * dg.size());
  for (const auto& spec : ref.table().specs()) {
    const std::vector<float> r(rg.begin() + spec.offset, rg.begin() + spec.offset + spec.numel());
    const std::vector<float> d(dg.begin() + spec.offset, dg.begin() + spec.offset + spec.numel());
    // Differently ordered fp32 sums through every layer; the CPU's own packing-invariance
    // test (test_model) allows the same.
    expect_close("grad " + spec.name, d, r, Tol{1e-5, 1e-3});
  }
}

// The arenas, the GEMM plan cache and the ops' scratch leave a repeated step allocation-free.
TEST_F(CudaOpsTest, SteadyStateStepsAllocateNothing) {
  ModelConfig cfg = testing::tiny_config();
  Model model(cfg, *gpu_);
  model.initialise(5);
  const Batch b = testing::make_batch(testing::sample_docs(), cfg, 3);
  model.step(b, 1.0f / float(b.loss_tokens()), true);
  const int64_t after_first = gpu_->allocations();
  for (int i = 0; i < 3; ++i) model.step(b, 1.0f / float(b.loss_tokens()), true);
  EXPECT_EQ(gpu_->allocations(), after_first);
}

TEST_F(CudaOpsTest, BackendCountsAllocationsAndCopies) {
  const int64_t before = gpu_->allocations();
  DeviceBuffer a(*gpu_, 1000), b(*gpu_, 1000);
  EXPECT_EQ(gpu_->allocations(), before + 2);
  std::vector<uint8_t> h(1000), back(1000);
  for (size_t i = 0; i < h.size(); ++i) h[i] = uint8_t(i * 7);
  gpu_->upload(a.data(), h.data(), h.size());
  gpu_->copy(b.data(), a.data(), h.size());
  gpu_->download(back.data(), b.data(), back.size());
  EXPECT_EQ(back, h);
  gpu_->zero(b.data(), 500);
  gpu_->download(back.data(), b.data(), back.size());
  EXPECT_TRUE(std::all_of(back.begin(), back.begin() + 500, [](uint8_t v) { return v == 0; }));
  EXPECT_EQ(back[700], h[700]);
}

}  // namespace
}  // namespace dhp
