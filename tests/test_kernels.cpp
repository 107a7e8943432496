// Every CPU op: forward against a direct formula where one exists, and the gradients of every
// row of the op table (tests/ops_table) against finite differences. Attention has its own
// tests (test_attention.cpp).
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <tuple>

#include "core/check.h"
#include "kernels/backend.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/patch_merge.h"
#include "kernels/cpu/pixels.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/vision_embed.h"
#include "tests/grad_check.h"
#include "tests/op_checks.h"

namespace dhp {
namespace {

using namespace dhp::cpu;
using testing::random_vec;

TEST(Matmul, LinearForwardMatchesLoops) {
  Rng rng(1);
  const int64_t T = 5, in = 7, out = 3;
  auto x = random_vec(rng, T * in), W = random_vec(rng, out * in), b = random_vec(rng, out);
  std::vector<float> y(T * out);
  linear_forward(y.data(), x.data(), W.data(), b.data(), T, in, out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * W[o * in + i];
      EXPECT_NEAR(y[t * out + o], s, 1e-5);
    }
}

// Parameter gradients accumulate: a second call doubles them, with or without dx and db.
TEST(Matmul, ParameterGradientsAccumulate) {
  Rng rng(2);
  const int64_t T = 6, in = 5, out = 4;
  auto x = random_vec(rng, T * in), W = random_vec(rng, out * in), r = random_vec(rng, T * out);
  std::vector<float> dx(T * in), dW(out * in, 0.0f), db(out, 0.0f);
  linear_backward(dx.data(), dW.data(), db.data(), r.data(), x.data(), W.data(), T, in, out);
  linear_backward(nullptr, dW.data(), db.data(), r.data(), x.data(), W.data(), T, in, out);
  std::vector<float> dW1(out * in, 0.0f);
  linear_backward(nullptr, dW1.data(), nullptr, r.data(), x.data(), W.data(), T, in, out);
  for (size_t i = 0; i < dW.size(); ++i) EXPECT_NEAR(dW[i], 2 * dW1[i], 1e-5);
}

// OpenBLAS's own threading changes the summation order with the thread count (seen for
// (64 x 64) outputs over K = 500); the tiled gemm must not.
TEST(Matmul, SameBitsForAnyThreadCount) {
  set_blas_threads(1);  // the CPU backend's setting: threads come from the tiles
  Rng rng(12);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{64, 64, 500}, {160, 64, 500},
                         {500, 64, 64}, {37, 300, 129}}) {
    for (bool ta : {false, true}) {
      auto A = random_vec(rng, M * K), B = random_vec(rng, K * N);
      std::vector<float> c1(M * N), c2(M * N);
      omp_set_num_threads(1);
      gemm(ta, false, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), N, 0.0f, c1.data(), N);
      omp_set_num_threads(2);
      gemm(ta, false, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), N, 0.0f, c2.data(), N);
      EXPECT_EQ(c1, c2) << M << "x" << N << "x" << K << " trans_a=" << ta;
      // And it is a product: spot-check one element.
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(ta ? A[k * M + 3] : A[3 * K + k]) * B[k * N + 5];
      EXPECT_NEAR(c1[3 * N + 5], s, 1e-4);
    }
  }
}

TEST(RMSNorm, Forward) {
  Rng rng(3);
  const int64_t T = 4, C = 8;
  auto x = random_vec(rng, T * C, 2.0f), w = random_vec(rng, C);
  std::vector<float> y(T * C), rstd(T);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, C, kRmsEps);
  double ms = 0;
  for (int64_t c = 0; c < C; ++c) ms += double(x[c]) * x[c];
  EXPECT_NEAR(y[1], x[1] / std::sqrt(ms / C + 1e-6) * w[1], 1e-5);
}

TEST(Rope, OneDimensionalRotatesHalfSplitPairs) {
  const int hd = 8;
  std::vector<float> x(hd);
  for (int i = 0; i < hd; ++i) x[i] = float(i + 1);
  int32_t pos = 3;
  rope_forward(x.data(), &pos, 1, 1, hd, 0, hd, 10000.0);
  for (int i = 0; i < hd / 2; ++i) {
    double a = 3.0 * std::pow(10000.0, -2.0 * i / hd);
    double x0 = i + 1, x1 = i + 1 + hd / 2;
    EXPECT_NEAR(x[i], x0 * std::cos(a) - x1 * std::sin(a), 1e-5);
    EXPECT_NEAR(x[i + hd / 2], x0 * std::sin(a) + x1 * std::cos(a), 1e-5);
  }
}

// Llama-3.1's frequencies (base 500000, head 128, factor 8, low 1, high 4, original 8192),
// written out from Meta's description: a wavelength 2π/f below 8192/4 keeps f, one above
// 8192/1 gets f/8, one between is blended linearly in 8192/wavelength. Every band is hit, the
// blend meets both neighbours at the bounds, and the rotation uses exactly these frequencies.
TEST(Rope, Llama3ScalingKeepsBlendsAndDividesByWavelength) {
  const int hd = 128;
  const RopeSpec spec = RopeSpec::llama3(500000.0, 8.0, 1.0, 4.0, 8192.0);
  int kept = 0, blended = 0, divided = 0;
  for (int i = 0; i < hd / 2; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / hd), wavelength = 2 * M_PI / f;
    double want = f;
    if (wavelength > 8192.0) {
      want = f / 8, ++divided;
    } else if (wavelength >= 2048.0) {
      const double s = (8192.0 / wavelength - 1.0) / (4.0 - 1.0);
      want = (1 - s) * f / 8 + s * f, ++blended;
    } else {
      ++kept;
    }
    EXPECT_NEAR(rope_inv_freq(spec, i, hd), want, 1e-15 * f) << "pair " << i;
    EXPECT_EQ(rope_inv_freq(RopeSpec(500000.0), i, hd), f) << "pair " << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(blended, 0);
  EXPECT_GT(divided, 0);
  // Continuity at the bounds: the blend is f at wavelength 2048 and f/8 at 8192.
  for (double wl : {2048.0, 8192.0}) {
    const double f = 2 * M_PI / wl;
    // Pair 1 of a span of 4 turns at theta^(-1/2): theta = f^-2 gives it frequency f.
    const RopeSpec at = RopeSpec::llama3(1.0 / (f * f), 8.0, 1.0, 4.0, 8192.0);
    const double got = rope_inv_freq(at, 1, 4);
    EXPECT_NEAR(got, wl == 2048.0 ? f : f / 8, 1e-9 * f) << wl;
  }
  std::vector<float> x(hd);
  for (int i = 0; i < hd; ++i) x[size_t(i)] = float(i + 1);
  const int32_t pos = 70000;
  rope_forward(x.data(), &pos, 1, 1, hd, 0, hd, spec);
  for (int i = 0; i < hd / 2; ++i) {
    const double a = pos * rope_inv_freq(spec, i, hd), x0 = i + 1, x1 = i + 1 + hd / 2;
    EXPECT_NEAR(x[size_t(i)], x0 * std::cos(a) - x1 * std::sin(a), 1e-4);
    EXPECT_NEAR(x[size_t(i + hd / 2)], x0 * std::sin(a) + x1 * std::cos(a), 1e-4);
  }
}

// 2-D RoPE is 1-D RoPE of half the width on each half.
TEST(Rope, TwoDimensionalIsOneDimensionalOnEachHalf) {
  Rng rng(4);
  const int64_t T = 5;
  const int H = 2, hd = 8;
  std::vector<int32_t> row = {0, 0, 1, 3, 2}, col = {0, 1, 0, 4, 5};
  auto x = random_vec(rng, T * H * hd), y = x, z = x;
  rope2d_forward(y.data(), row.data(), col.data(), T, H, hd, 100.0);
  rope_forward(z.data(), row.data(), T, H, hd, 0, hd / 2, 100.0);
  rope_forward(z.data(), col.data(), T, H, hd, hd / 2, hd / 2, 100.0);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], z[i]);
}

TEST(Activation, SwiGLUAndGELUForward) {
  Rng rng(5);
  const int64_t n = 30;
  auto a = random_vec(rng, n, 3.0f), b = random_vec(rng, n, 3.0f);
  std::vector<float> h(n);
  swiglu_forward(h.data(), a.data(), b.data(), n);
  EXPECT_NEAR(h[0], a[0] / (1 + std::exp(-a[0])) * b[0], 1e-5);

  auto x = random_vec(rng, n, 4.0f);
  std::vector<float> y(n);
  gelu_forward(y.data(), x.data(), n, GeluKind::Tanh);
  double v = x[3];
  EXPECT_NEAR(y[3], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))), 1e-5);
}

// Each kind against its formula in double, and the kinds apart from each other by far more
// than that (so the dispatch cannot hand one kind's formula to another).
TEST(Activation, GeluKindsForward) {
  Rng rng(15);
  const int64_t n = 200;
  auto x = random_vec(rng, n, 4.0f);
  std::vector<float> tanh_y(n), erf_y(n), quick_y(n);
  gelu_forward(tanh_y.data(), x.data(), n, GeluKind::Tanh);
  gelu_forward(erf_y.data(), x.data(), n, GeluKind::Erf);
  gelu_forward(quick_y.data(), x.data(), n, GeluKind::Quick);
  double tanh_erf = 0, erf_quick = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    EXPECT_NEAR(erf_y[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 2e-6) << v;
    EXPECT_NEAR(quick_y[i], v / (1 + std::exp(-1.702 * v)), 2e-6) << v;
    tanh_erf = std::max(tanh_erf, double(std::abs(tanh_y[i] - erf_y[i])));
    erf_quick = std::max(erf_quick, double(std::abs(erf_y[i] - quick_y[i])));
  }
  EXPECT_GT(tanh_erf, 1e-4);
  EXPECT_GT(erf_quick, 1e-2);
}

// Against the definition in double, with a mean far from zero (the two-pass variance).
TEST(LayerNorm, Forward) {
  Rng rng(16);
  const int64_t T = 5, C = 37;
  auto x = random_vec(rng, T * C, 0.5f), w = random_vec(rng, C), b = random_vec(rng, C);
  for (auto& v : x) v += 20.0f;
  std::vector<float> y(T * C), mean(T), rstd(T);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), T, C, 1e-5f);
  for (int64_t t = 0; t < T; ++t) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += x[t * C + c];
    mu /= C;
    for (int64_t c = 0; c < C; ++c) var += (x[t * C + c] - mu) * (x[t * C + c] - mu);
    var /= C;  // biased, as nn.LayerNorm
    const double r = 1 / std::sqrt(var + 1e-5);
    EXPECT_NEAR(mean[t], mu, 1e-5);
    EXPECT_NEAR(rstd[t], r, 1e-5 * r);
    for (int64_t c = 0; c < C; ++c)
      EXPECT_NEAR(y[t * C + c], (x[t * C + c] - mu) * r * w[c] + b[c], 2e-5) << t << "," << c;
  }
}

// Grids of the pretrained size pass the table through unchanged (weights 0, 1, 0, 0), the class
// row is written (not added), rows outside the images keep their values, and a constant table
// stays constant at any size (the weights of every output sum to one).
TEST(VisionEmbed, IdentityClassRowAndConstants) {
  for (PosResize resize : {PosResize::bicubic, PosResize::bilinear_corners}) {
  SCOPED_TRACE(resize == PosResize::bicubic ? "bicubic" : "bilinear");
  Rng rng(17);
  const int64_t C = 6;
  const int g0h = 3, g0w = 5;
  auto table = random_vec(rng, (1 + g0h * g0w) * C), cls = random_vec(rng, C);
  const std::vector<PosImage> same = {{1, g0h, g0w}};
  std::vector<float> x(size_t(2 + 1 + g0h * g0w) * C, 0.5f);
  vision_embed_forward(x.data(), table.data(), cls.data(), same.data(), 1, C, g0h, g0w, resize);
  for (int64_t k = 0; k < C; ++k) {
    EXPECT_EQ(x[k], 0.5f);                               // the row before the image
    EXPECT_EQ(x[C + k], cls[k] + table[k]);              // the class row
    EXPECT_EQ(x[x.size() - C + k], 0.5f);                // the row after it
  }
  for (int64_t p = 0; p < g0h * g0w; ++p)
    for (int64_t k = 0; k < C; ++k)
      ASSERT_EQ(x[(2 + p) * C + k], 0.5f + table[(1 + p) * C + k]) << p;

  std::vector<float> flat(size_t(g0h * g0w) * C, 0.25f);
  for (auto [gh, gw] : {std::pair<int, int>{1, 1}, {7, 2}, {2, 13}, {40, 40}}) {
    const std::vector<PosImage> im = {{0, gh, gw}};
    std::vector<float> y(size_t(gh * gw) * C, 0.0f);
    vision_embed_forward(y.data(), flat.data(), nullptr, im.data(), 1, C, g0h, g0w, resize);
    // Up to a few float roundings of weights that sum to one.
    for (float v : y) ASSERT_NEAR(v, 0.25f, 5e-7) << gh << "x" << gw;
  }
  }
}

// The backward pass is parallel over channels with each channel's sums in one order: the same
// bits on one thread and on several.
TEST(VisionEmbed, BackwardSameBitsForAnyThreadCount) {
  Rng rng(18);
  const int64_t C = 70;
  const int g0h = 6, g0w = 6;
  const std::vector<PosImage> ims = {{0, 9, 13}, {1 + 9 * 13, 4, 3}, {2 + 9 * 13 + 12, 6, 6}};
  const int64_t rows = 3 + 9 * 13 + 12 + 36;
  auto dx = random_vec(rng, rows * C);
  auto d1 = random_vec(rng, (1 + g0h * g0w) * C), c1 = random_vec(rng, C);
  auto d2 = d1, c2 = c1;
  omp_set_num_threads(1);
  vision_embed_backward(d1.data(), c1.data(), dx.data(), ims.data(), 3, C, g0h, g0w, PosResize::bicubic);
  omp_set_num_threads(2);
  vision_embed_backward(d2.data(), c2.data(), dx.data(), ims.data(), 3, C, g0h, g0w, PosResize::bicubic);
  EXPECT_EQ(d1, d2);
  EXPECT_EQ(c1, c2);
}

// M-RoPE against Hugging Face's rotary of the Qwen-VL text models (tests/reference/mrope_ref.py,
// float64): Qwen3-VL's interleaved layout with its sections (24, 20, 20) at head_dim 128, and
// Qwen2-VL's blocked one (16, 24, 24), on image-like positions (a shared temporal position,
// height and width apart) and text ones (all three equal). Negative controls: the other layout
// and 1-D RoPE by the temporal row each miss by far more than the tolerance; on text positions
// alone every layout is 1-D RoPE.
TEST(MRope, MatchesTransformersRotaryInBothLayouts) {
  namespace fs = std::filesystem;
  const int64_t T = 40;
  const int H = 2, hd = 128;
  const fs::path dir = fs::temp_directory_path() / ("dhp_mrope_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Rng rng(41);
  const std::vector<float> x = random_vec(rng, size_t(T * H * hd));
  std::vector<int32_t> pos(size_t(3 * T));
  for (int64_t t = 0; t < T; ++t) {
    // Tokens 10..33 an image of 4 x 6 merged tokens at base 10; text before and after it.
    const bool image = t >= 10 && t < 34;
    const int32_t base = t < 10 ? int32_t(t) : t < 34 ? 10 : int32_t(16 + t - 34);
    const int32_t r = image ? int32_t((t - 10) / 6) : 0, c = image ? int32_t((t - 10) % 6) : 0;
    pos[size_t(3 * t)] = base, pos[size_t(3 * t + 1)] = base + r, pos[size_t(3 * t + 2)] = base + c;
  }
  std::ofstream(dir / "x.bin", std::ios::binary).write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * 4));
  std::ofstream(dir / "pos.bin", std::ios::binary).write(reinterpret_cast<const char*>(pos.data()), std::streamsize(pos.size() * 4));
  auto read = [&](const std::string& name) {
    std::vector<float> v(x.size());
    std::ifstream in(dir / name, std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
    EXPECT_TRUE(in.good()) << name;
    return v;
  };
  auto worst = [](const std::vector<float>& a, const std::vector<float>& b, int64_t t0, int64_t t1, int64_t row) {
    double w = 0.0;
    for (int64_t i = t0 * row; i < t1 * row; ++i) w = std::max(w, double(std::abs(a[size_t(i)] - b[size_t(i)])));
    return w;
  };
  const int64_t row = int64_t(H) * hd;
  for (const auto& [interleaved, section] : {std::pair{true, std::array<int, 3>{24, 20, 20}},
                                             std::pair{false, std::array<int, 3>{16, 24, 24}}}) {
    std::ofstream(dir / "case.json") << fmt::format("{{\"T\": {}, \"H\": {}, \"hd\": {}, \"theta\": 1000000.0, "
                                                    "\"section\": [{}, {}, {}]}}",
                                                    T, H, hd, section[0], section[1], section[2]);
    const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/mrope_ref.py " + dir.string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed: it needs Debian's python3-torch (scripts/setup.sh)";
    RopeSpec spec(1000000.0);
    for (int a = 0; a < 3; ++a) spec.mrope_section[a] = section[size_t(a)];
    spec.mrope_interleaved = interleaved;
    std::vector<float> y = x;
    rope_forward(y.data(), pos.data(), T, H, hd, 0, hd, spec);
    const auto ours = interleaved ? read("interleaved.bin") : read("blocked.bin");
    const auto other = interleaved ? read("blocked.bin") : read("interleaved.bin");
    const auto plain = read("plain.bin");
    const char* what = interleaved ? "interleaved" : "blocked";
    EXPECT_LT(worst(y, ours, 0, T, row), 2e-5) << what;
    EXPECT_GT(worst(y, other, 10, 34, row), 100 * 2e-5) << what << ": the other layout";
    EXPECT_GT(worst(y, plain, 10, 34, row), 100 * 2e-5) << what << ": 1-D RoPE";
    EXPECT_LT(worst(y, plain, 0, 10, row), 2e-5) << what << ": text";
    EXPECT_LT(worst(y, plain, 34, T, row), 2e-5) << what << ": text";
    // Backward undoes forward.
    rope_backward(y.data(), pos.data(), T, H, hd, 0, hd, spec);
    EXPECT_LT(worst(y, x, 0, T, row), 1e-5) << what;
  }
  // The Qwen-VL vision towers' 2-D RoPE: blocked sections (0, hd/4, hd/4) by patch row and
  // column, each restarting the frequencies; without the restart it is another rotation.
  RopeSpec vision(1000000.0);
  vision.mrope_section[1] = vision.mrope_section[2] = hd / 4;
  vision.mrope_restart = true;
  std::vector<float> y = x;
  rope_forward(y.data(), pos.data(), T, H, hd, 0, hd, vision);
  EXPECT_LT(worst(y, read("vision.bin"), 0, T, row), 2e-5) << "vision";
  vision.mrope_restart = false;
  std::vector<float> z = x;
  rope_forward(z.data(), pos.data(), T, H, hd, 0, hd, vision);
  EXPECT_GT(worst(z, read("vision.bin"), 10, 34, row), 100 * 2e-5) << "vision without the restart";
  fs::remove_all(dir);
}

// The bicubic resize against PyTorch's own (tests/reference/bicubic_ref.py: F.interpolate with
// mode="bicubic", align_corners=False, size=..., and its autograd), on streams of several
// images: up and down, non-square, a side of 1, the pretrained size; with and without the class
// row. The negative control: the same streams resized bilinearly must differ from ours by far
// more than the tolerance, or the comparison could not tell the two apart.
TEST(VisionEmbed, MatchesPyTorchBicubicAndItsGradient) {
  struct Group {
    int g0h, g0w;
    bool cls;
    std::vector<std::pair<int, int>> grids;
  };
  const std::vector<Group> groups = {
      {24, 24, true, {{24, 24}, {36, 20}, {12, 12}, {1, 7}, {30, 1}}},
      {4, 4, false, {{9, 5}, {2, 3}, {1, 1}, {4, 4}}},
      {3, 5, true, {{7, 11}, {2, 2}, {3, 5}}},
      {6, 2, false, {{1, 9}, {13, 1}}}};
  const int64_t C = 5;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dhp_bicubic_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::vector<float>& v) {
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
  };
  auto read = [&](const std::string& name, size_t n) {
    std::vector<float> v(n);
    std::ifstream in(dir / name, std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
    EXPECT_TRUE(in.good()) << name;
    return v;
  };
  Rng rng(19);
  std::string spec = "{\"C\": " + std::to_string(C) + ", \"groups\": [";
  struct Ran {
    std::vector<PosImage> images;
    int64_t rows, n_pos;
    std::vector<float> table, cls, dy;
  };
  std::vector<Ran> ran;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    Ran r;
    r.rows = 0;
    spec += (i ? ", " : "") + fmt::format("{{\"g0h\": {}, \"g0w\": {}, \"cls\": {}, \"grids\": [",
                                          g.g0h, g.g0w, g.cls ? "true" : "false");
    for (size_t k = 0; k < g.grids.size(); ++k) {
      const auto [gh, gw] = g.grids[k];
      r.images.push_back(PosImage{r.rows, gh, gw});
      r.rows += (g.cls ? 1 : 0) + int64_t(gh) * gw;
      spec += (k ? ", " : "") + fmt::format("[{}, {}]", gh, gw);
    }
    spec += "]}";
    r.n_pos = (g.cls ? 1 : 0) + int64_t(g.g0h) * g.g0w;
    r.table = random_vec(rng, size_t(r.n_pos * C));
    r.cls = random_vec(rng, size_t(C));
    r.dy = random_vec(rng, size_t(r.rows * C));
    write(fmt::format("table_{}.bin", i), r.table);
    write(fmt::format("cls_{}.bin", i), r.cls);
    write(fmt::format("dy_{}.bin", i), r.dy);
    ran.push_back(std::move(r));
  }
  spec += "]}";
  std::ofstream(dir / "cases.json") << spec;
  const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) +
                          "/tests/reference/bicubic_ref.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << cmd << " failed: it needs Debian's python3-torch (scripts/setup.sh installs it)";

  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& g = groups[i];
    const Ran& r = ran[i];
    const int n = int(r.images.size());
    std::vector<float> x(size_t(r.rows * C), 0.0f);
    vision_embed_forward(x.data(), r.table.data(), g.cls ? r.cls.data() : nullptr,
                         r.images.data(), n, C, g.g0h, g.g0w, PosResize::bicubic);
    const auto exact = read(fmt::format("exact_{}.bin", i), x.size());
    const auto torch32 = read(fmt::format("torch_{}.bin", i), x.size());
    const auto bilinear = read(fmt::format("bilinear_{}.bin", i), x.size());
    for (int k = 0; k < n; ++k) {
      const PosImage im = r.images[size_t(k)];
      const std::string at = fmt::format("g0 {}x{} -> {}x{}", g.g0h, g.g0w, im.grid_h, im.grid_w);
      const int64_t begin = im.row * C,
                    end = (im.row + (g.cls ? 1 : 0) + int64_t(im.grid_h) * im.grid_w) * C;
      double err = 0, err32 = 0, apart = 0;
      for (int64_t j = begin; j < end; ++j) {
        const size_t u = size_t(j);
        err = std::max(err, double(std::abs(x[u] - exact[u])));
        err32 = std::max(err32, double(std::abs(x[u] - torch32[u])));
        apart = std::max(apart, double(std::abs(x[u] - bilinear[u])));
      }
      // Ours computes in double and rounds once; PyTorch's float64 resize rounds once (to the
      // file's fp32): half an ulp each, apart from each other by at most one (~1.2e-7 here).
      EXPECT_LE(err, 1e-6) << at;
      // PyTorch's fp32 kernel: a float scale and float weights, which move the taps' weights by
      // ~1e-6 on large grids, and a few roundings of 16-term sums of magnitude ~1.
      EXPECT_LE(err32, 5e-6) << at;
      // Bilinear equals bicubic only where nothing is resized.
      if (im.grid_h != g.g0h || im.grid_w != g.g0w)
        EXPECT_GT(apart, 1e-3) << at << ": bilinear is indistinguishable from bicubic here";
      else
        EXPECT_LE(apart, 1e-6) << at;
    }
    // The transpose against autograd: in float64 (both within a rounding of the exact sum),
    // and of PyTorch's fp32 kernel, whose backward adds every term in float.
    std::vector<float> dtable(size_t(r.n_pos * C), 0.0f), dcls(size_t(C), 0.0f);
    vision_embed_backward(dtable.data(), g.cls ? dcls.data() : nullptr, r.dy.data(),
                          r.images.data(), n, C, g.g0h, g.g0w, PosResize::bicubic);
    const auto ref_table = read(fmt::format("dtable_exact_{}.bin", i), dtable.size());
    const auto torch_table = read(fmt::format("dtable_torch_{}.bin", i), dtable.size());
    const auto ref_cls = read(fmt::format("dcls_exact_{}.bin", i), dcls.size());
    for (size_t j = 0; j < dtable.size(); ++j) {
      ASSERT_NEAR(dtable[j], ref_table[j], 1e-6 * (1 + std::abs(ref_table[j])))
          << "dtable[" << j / C << "][" << j % C << "] g0 " << g.g0h << "x" << g.g0w;
      ASSERT_NEAR(dtable[j], torch_table[j], 2e-5 * (1 + std::abs(torch_table[j])))
          << "dtable[" << j / C << "][" << j % C << "] g0 " << g.g0h << "x" << g.g0w;
    }
    for (size_t j = 0; j < dcls.size(); ++j)
      ASSERT_NEAR(dcls[j], ref_cls[j], 1e-6 * (1 + std::abs(ref_cls[j]))) << j;
  }
  fs::remove_all(dir);
}

// Qwen3-VL's bilinear resize against transformers' fast_pos_embed_interpolate written out in
// PyTorch (tests/reference/qwen_pos_ref.py, float64 from the float32 inputs) and its autograd:
// a 6 x 6 table onto grids larger, smaller, non-square, a side of 1, and its own size. The
// negative control: the same table resized bicubically (CLIP's rule) misses by far more.
TEST(VisionEmbed, MatchesQwen3VlBilinearAndItsGradient) {
  namespace fs = std::filesystem;
  const int N = 6;
  const int64_t C = 5;
  const std::vector<std::pair<int, int>> grids = {{6, 6}, {12, 8}, {3, 10}, {1, 4}, {9, 1}, {2, 2}};
  const fs::path dir = fs::temp_directory_path() / ("dhp_qwen_pos_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Rng rng(23);
  std::vector<PosImage> ims;
  int64_t rows = 0;
  std::string spec = fmt::format("{{\"N\": {}, \"C\": {}, \"grids\": [", N, C);
  for (size_t k = 0; k < grids.size(); ++k) {
    ims.push_back(PosImage{rows, grids[k].first, grids[k].second});
    rows += int64_t(grids[k].first) * grids[k].second;
    spec += fmt::format("{}[{}, {}]", k ? ", " : "", grids[k].first, grids[k].second);
  }
  spec += "]}";
  const auto table = random_vec(rng, size_t(N * N * C)), dy = random_vec(rng, size_t(rows * C));
  auto write = [&](const char* name, const std::vector<float>& v) {
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
  };
  auto read = [&](const char* name, size_t n) {
    std::vector<float> v(n);
    std::ifstream in(dir / name, std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
    EXPECT_TRUE(in.good()) << name;
    return v;
  };
  write("table.bin", table);
  write("dy.bin", dy);
  std::ofstream(dir / "case.json") << spec;
  const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/qwen_pos_ref.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed: it needs Debian's python3-torch (scripts/setup.sh)";
  const auto want = read("out.bin", size_t(rows * C)), want_d = read("dtable.bin", table.size());
  fs::remove_all(dir);
  std::vector<float> x(size_t(rows * C), 0.0f), cubic(x.size(), 0.0f);
  vision_embed_forward(x.data(), table.data(), nullptr, ims.data(), int(ims.size()), C, N, N, PosResize::bilinear_corners);
  vision_embed_forward(cubic.data(), table.data(), nullptr, ims.data(), int(ims.size()), C, N, N, PosResize::bicubic);
  double worst = 0.0, control = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    worst = std::max(worst, double(std::abs(x[i] - want[i])));
    control = std::max(control, double(std::abs(cubic[i] - want[i])));
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_GT(control, 1000 * 1e-6) << "bicubic and bilinear agree: the comparison cannot tell them apart";
  std::vector<float> dtable(table.size(), 0.0f);
  vision_embed_backward(dtable.data(), nullptr, dy.data(), ims.data(), int(ims.size()), C, N, N,
                        PosResize::bilinear_corners);
  for (size_t j = 0; j < dtable.size(); ++j)
    ASSERT_NEAR(dtable[j], want_d[j], 1e-6 * (1 + std::abs(want_d[j]))) << "dtable[" << j / C << "][" << j % C << "]";
}

TEST(VisionEmbed, BadGridIsRejected) {
  std::vector<float> x(8), table(8);
  const std::vector<PosImage> im = {{0, 0, 2}};
  EXPECT_THROW(vision_embed_forward(x.data(), table.data(), nullptr, im.data(), 1, 2, 2, 2, PosResize::bicubic),
               dhp::Error);
  const std::vector<PosImage> ok = {{0, 1, 2}};
  EXPECT_THROW(vision_embed_forward(x.data(), table.data(), nullptr, ok.data(), 1, 2, 0, 2, PosResize::bicubic),
               dhp::Error);
}

TEST(CrossEntropy, LossAndAccuracy) {
  Rng rng(6);
  const int64_t T = 5, V = 7;
  auto logits = random_vec(rng, T * V, 3.0f);
  std::vector<int32_t> targets = {2, -1, 6, 0, -1};
  std::vector<float> lse(T);
  auto st = cross_entropy_forward(lse.data(), logits.data(), targets.data(), T, V);
  EXPECT_EQ(st.count, 3);
  double expect = 0;
  int64_t correct = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] < 0) continue;
    double s = 0;
    int64_t arg = 0;
    for (int64_t v = 0; v < V; ++v) {
      s += std::exp(double(logits[t * V + v]));
      if (logits[t * V + v] > logits[t * V + arg]) arg = v;
    }
    expect += std::log(s) - logits[t * V + targets[t]];
    correct += arg == targets[t];
  }
  EXPECT_NEAR(st.loss_sum, expect, 1e-5);
  EXPECT_EQ(st.correct, correct);
}

TEST(Embedding, LookupSkipsNegativeIds) {
  Rng rng(7);
  const int64_t V = 6, C = 20, T = 7;
  auto table = random_vec(rng, V * C);
  std::vector<int32_t> ids = {3, 1, -1, 3, 0, 5, 3};
  std::vector<float> out(T * C);
  embedding_forward(out.data(), ids.data(), table.data(), T, C);
  EXPECT_EQ(out[2 * C + 4], 0.0f);
  EXPECT_EQ(out[3 * C + 4], table[3 * C + 4]);
}

TEST(PatchMerge, Order) {
  // Two images: 2x4 and 2x2 patches, C = 1, values = patch index.
  const int64_t C = 1;
  std::vector<MergeImage> ims = {{0, 2, 4}, {8, 2, 2}};
  std::vector<float> in(12);
  for (int i = 0; i < 12; ++i) in[i] = float(i);
  std::vector<float> out(12);
  patch_merge_forward(out.data(), in.data(), ims.data(), 2, C, 2);
  // Image 0 row-major grid 2x4: merged token 0 = (0,0),(0,1),(1,0),(1,1) = 0,1,4,5.
  std::vector<float> expect = {0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(out, expect);
}

// The spec's formula per channel (channel fastest), in fp32, for every 8-bit value.
TEST(Pixels, NormalisedByChannel) {
  const PixelNorm norm{{0.5f, 0.25f, 0.75f}, {0.2f, 0.4f, 0.1f}};
  std::vector<uint8_t> px(3 * 256 + 2);
  for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t((i / 3 + 7 * (i % 3)) % 256);
  std::vector<float> y(px.size(), 7.0f);
  cpu::normalize_pixels(y.data(), px.data(), int64_t(px.size()), norm);
  for (size_t i = 0; i < px.size(); ++i) {
    const int c = int(i % 3);
    ASSERT_EQ(y[i], (float(px[i]) / 255.0f - norm.mean[c]) / norm.std[c]) << i;
  }
}

TEST(Elementwise, SumSquaresAndAdamW) {
  std::vector<float> x(100000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 7) - 3.0f;
  double expect = 0;
  for (float v : x) expect += double(v) * v;
  EXPECT_DOUBLE_EQ(sum_squares(x.data(), int64_t(x.size())), expect);

  // One AdamW step from zero moments: m̂ = g, v̂ = g², so p -= lr·(g/(|g|+eps) + wd·p).
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, -0.25f}, m(2, 0.0f), v(2, 0.0f);
  adamw_update(p.data(), g.data(), m.data(), v.data(), 2, AdamWStep{0.1f, 0.9f, 0.99f, 1e-8f, 0.1f, 1});
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (1.0 + 0.1 * 1.0), 1e-5);
  EXPECT_NEAR(p[1], -2.0 - 0.1 * (-1.0 + 0.1 * -2.0), 1e-5);
}

// Every row of the op table with a loss: its backward pass against central differences of that
// loss, on the CPU reference in fp32.
class OpGradients : public ::testing::TestWithParam<testing::OpCase> {};

TEST_P(OpGradients, MatchFiniteDifferences) {
  const auto cpu = make_cpu_backend(BackendOptions{});
  testing::expect_gradients(GetParam(), cpu->ops());
}

INSTANTIATE_TEST_SUITE_P(OpTable, OpGradients, ::testing::ValuesIn(testing::grad_cases()),
                         [](const auto& info) { return testing::test_name(info.param); });

}  // namespace
}  // namespace dhp

namespace dhp::cpu {
namespace {

TEST(LoadMonitor, ThreadsFollowTheCoresOthersLeaveFree) {
  EXPECT_EQ(threads_for_free_cores(2, 2.0, 0.0), 2);   // idle machine: every configured thread
  EXPECT_EQ(threads_for_free_cores(2, 2.0, 0.3), 2);   // a little background noise
  EXPECT_EQ(threads_for_free_cores(2, 2.0, 0.7), 1);   // one core mostly taken
  EXPECT_EQ(threads_for_free_cores(2, 2.0, 1.0), 1);   // one busy process
  EXPECT_EQ(threads_for_free_cores(2, 2.0, 3.0), 1);   // never fewer than one
  EXPECT_EQ(threads_for_free_cores(4, 16.0, 2.0), 4);  // never more than configured
  EXPECT_EQ(threads_for_free_cores(8, 8.0, 2.4), 6);
  EXPECT_EQ(threads_for_free_cores(3, 4.0, -1.0), 3);  // a negative estimate reads as idle
}

TEST(LoadMonitor, HoldsTheConfiguredCountUntilItHasMeasured) {
  LoadMonitor m;
  EXPECT_EQ(m.threads_for(2), 2);  // less than the sampling interval has passed
}

// train.device = "auto": CUDA only where the build registered it and its probe finds a
// device; every other name passes through unchanged.
TEST(BackendRegistry, AutoPicksCudaOnlyWhenADeviceIsUsable) {
  BackendRegistry r;
  r.add("cpu", make_cpu_backend);
  EXPECT_EQ(r.resolve("auto"), "cpu");
  EXPECT_EQ(r.resolve("cuda"), "cuda");
  std::string why_not = "no driver";
  r.add("cuda", make_cpu_backend, [&] { return why_not; });
  EXPECT_EQ(r.resolve("auto"), "cpu");
  why_not.clear();
  EXPECT_EQ(r.resolve("auto"), "cuda");
  EXPECT_EQ(r.resolve("cpu"), "cpu");
  EXPECT_EQ(r.make("auto", BackendOptions{})->name(), "cpu");  // the stand-in factory's backend
}

}  // namespace
}  // namespace dhp::cpu
