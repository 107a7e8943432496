// The rows of the op table (tests/ops_table/op_table.h): one builder per op, its tolerances
// with their reasons, and the shapes each use takes.
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <utility>

#include "tests/ops_table/op_table.h"

namespace dhp::testing {
namespace {

std::string str(int64_t v) { return std::to_string(v); }
size_t sz(int64_t n) { return size_t(n); }

// ---- Tolerances ----------------------------------------------------------------------------

// Copies, permutations, one fp32 add and one rounding, and sums taken in the same order as the
// CPU's: bit for bit.
constexpr Tol kZero{0.0, 0.0};
constexpr OpTol kExact{kZero, kZero, kZero, kZero};
// bf16: both sides round an fp32 result once; the two fp32 results differ in their last bits,
// which moves a stored value by at most one bf16 step (2^-7 relative at most).
constexpr Tol kStep{1e-6, 0x1p-7 + 1e-6};
// Device: the same float operations in the same order; the bound absorbs fused multiply-adds
// and the device's expf/tanhf (2 ulp), which GELU's derivative amplifies ~10x at |x| = 4 where
// 1 - tanh² cancels.
constexpr Tol kDevicePointwise{1e-5, 1e-5};
// Emulated: the same float operations on the same host math library, bit-identical with the
// default flags; the bound leaves room for a build that contracts multiply-adds in one copy.
constexpr Tol kHostPointwise{1e-6, 1e-5};
constexpr OpTol kPointwise{kDevicePointwise, kStep, kHostPointwise, kStep};
// GELU's derivative amplifies the device's tanhf error where 1 - tanh² cancels, in bf16 too.
constexpr OpTol kGeluGrad{kDevicePointwise, {1e-5, 0x1p-7 + 1e-5}, kHostPointwise, kStep};
// The same double angles and float rotation on both sides.
constexpr OpTol kRope{{1e-6, 1e-5}, kStep, kHostPointwise, kStep};
// Row reductions summed in float on the device, in double on the CPU: ~sqrt(C)·eps apart; under
// the emulator a float sum of C squares in 256 strided lanes.
constexpr Tol kRowReduce{1e-5, 1e-5};
constexpr OpTol kRowStat{kRowReduce, kRowReduce, {1e-6, 1e-5}, {1e-6, 1e-5}};
constexpr OpTol kRmsY{kRowReduce, kStep, {1e-6, 1e-5}, kStep};
// dx subtracts a row mean of C products: absolute error ~ sqrt(C)·eps of O(1) terms (in bf16,
// near-zero values carry the mean's fp32 error).
OpTol rms_dx(int64_t C) {
  const double s = std::sqrt(double(C));
  return {{1e-5 * s, 1e-4}, {1e-5 * s, 0x1p-7 + 1e-4}, {1e-6 * s, 1e-5}, {1e-6 * s, 0x1p-7}};
}
// dw: T terms summed in 16 interleaved lanes on the device, in row order on the CPU. The
// emulated fp32 sum is also held to its summation-order bound (test_cuda_kernels_emulated).
OpTol rms_dw(int64_t T) {
  const Tol t{1e-6 * double(T), 1e-4};
  return {t, t, t, {1e-5, 1e-5}};
}
// Float exponentials summed per thread, then combined: ~1e-6 from the CPU's double sum.
constexpr OpTol kLse{{1e-5, 1e-6}, {1e-5, 1e-6}, {1e-5, 1e-6}, {1e-5, 1e-6}};
// loss_sum carries T rows of lse error; count and correct are integers (exact below 1).
OpTol ce_stats(int64_t T) {
  const Tol t{1e-5 * double(T), 0.0};
  return {t, t, t, t};
}
// exp(x - lse) with the two lse up to 1e-5 apart: that relative error, and at the target,
// where p - scale cancels, scale·1e-5 absolute.
constexpr OpTol kDlogits{{3e-6, 1e-5}, {3e-6, 0x1p-7 + 1e-5}, kHostPointwise,
                             {3e-6, 0x1p-7 + 1e-5}};
// Both sum exact float squares in double, in different orders; the longest sequential run (the
// CPU's 16384-element chunks) bounds the relative error by ~2e-12.
constexpr OpTol kSumSquares{{0, 1e-11}, {0, 1e-11}, {0, 1e-11}, {0, 1e-11}};
// The same float formula with the same host-rounded bias corrections; fused multiply-adds on
// the device move the last bit or two.
constexpr OpTol kAdamW{{1e-7, 1e-6}, {1e-7, 1e-6}, kHostPointwise, kHostPointwise};
// Column sums in fp32 in either storage, 16 lanes against the CPU's row order.
constexpr OpTol kColumnSum{{1e-5, 1e-5}, {1e-5, 1e-5}, {1e-5, 1e-5}, {1e-5, 1e-5}};

// ---- Inputs ---------------------------------------------------------------------------------

std::vector<int32_t> below(Rng& rng, int64_t n, uint64_t bound) {
  std::vector<int32_t> v(sz(n));
  for (auto& x : v) x = int32_t(rng.below(bound));
  return v;
}
// Ids in [0, V), -1 (no row) one time in `none`.
std::vector<int32_t> ids(Rng& rng, int64_t T, int64_t V, uint64_t none) {
  std::vector<int32_t> v(sz(T));
  for (auto& x : v) x = rng.below(none) == 0 ? -1 : int32_t(rng.below(uint64_t(V)));
  return v;
}

// ---- Rows -----------------------------------------------------------------------------------

OpCase named(std::string op, std::string shape) {
  OpCase c;
  c.op = std::move(op);
  c.shape = std::move(shape);
  return c;
}

OpCase linear(int64_t T, int64_t in, int64_t out, bool bias = true) {
  OpCase c = named("linear", str(T) + "x" + str(in) + " -> " + str(out));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{act("x", uniform(r, sz(T * in))), act("W", uniform(r, sz(out * in))),
                               act("b", uniform(r, sz(out))), act_out("y", sz(T * out)),
                               act("dy", uniform(r, sz(T * out))), act_out("dx", sz(T * in)),
                               f32("dW", uniform(r, sz(out * in))), f32("db", uniform(r, sz(out)))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.linear_forward(a.act("y"), a.act("x"), a.act("W"), bias ? a.act("b") : Act(), T, in, out);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.linear_backward(a.act("dx"), a.f32("dW"), bias ? a.f32("db") : nullptr, a.act("dy"),
                      a.act("x"), a.act("W"), T, in, out, false);
  };
  c.loss = [=](const Args& a) { return weighted(a, "y", "dy", sz(T * out)); };
  c.grads = {{"x", "dx"}, {"W", "dW", true}};
  if (bias) c.grads.push_back({"b", "db", true});
  c.flops_forward = 2.0 * double(T * in * out);
  c.flops_backward = 4.0 * double(T * in * out);
  return c;
}

// eps is model.rms_norm_eps; a large one with small inputs makes it move every output.
OpCase rmsnorm(int64_t T, int64_t C, float scale = 1.0f, float eps = 1e-6f) {
  OpCase c = named("rmsnorm", str(T) + "x" + str(C) + (eps != 1e-6f ? fmt::format(" eps={:g}", eps) : std::string()));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{act("x", uniform(r, sz(T * C), scale)), act("w", uniform(r, sz(C))),
                               act_out("y", sz(T * C)), f32_out("rstd", sz(T)),
                               act("dy", uniform(r, sz(T * C))), act_out("dx", sz(T * C)),
                               f32("dw", uniform(r, sz(C)))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.rmsnorm_forward(a.act("y"), a.f32("rstd"), a.act("x"), a.act("w"), T, C, eps);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.rmsnorm_backward(a.act("dx"), a.f32("dw"), a.act("dy"), a.act("x"), a.act("w"),
                       a.f32("rstd"), T, C);
  };
  c.checks = {{"rstd", kRowStat}, {"y", kRmsY}, {"dx", rms_dx(C)}, {"dw", rms_dw(T)}};
  c.loss = [=](const Args& a) { return weighted(a, "y", "dy", sz(T * C)); };
  c.grads = {{"x", "dx"}, {"w", "dw", true}};
  c.flops_forward = 4.0 * double(T * C);
  c.flops_backward = 8.0 * double(T * C);
  return c;
}

// Llama-3.1's scaling (factor 8, low 1, high 4) with the original context shrunk to 256 so
// that, with base 500000 and hd >= 8, the wavelengths (2π·500000^(2i/hd)) fall in all three of
// its bands: kept below 64, blended between 64 and 256, divided by 8 above.
RopeSpec llama3_rope() { return RopeSpec::llama3(500000.0, 8.0, 1.0, 4.0, 256.0); }

// M-RoPE over hd / 2 pairs split as `t, h, w`, interleaved (Qwen3-VL) or blocked (Qwen2-VL);
// `restart`: each section restarting the frequencies (the Qwen-VL vision towers' 2-D RoPE).
RopeSpec mrope(int t, int h, int w, bool interleaved, double base = 10000.0, bool restart = false) {
  RopeSpec r(base);
  r.mrope_restart = restart;
  r.mrope_section[0] = t;
  r.mrope_section[1] = h;
  r.mrope_section[2] = w;
  r.mrope_interleaved = interleaved;
  return r;
}

// In place: forward rotates x, backward rotates dx back. 1-D RoPE by pos, or 2-D by (row, col);
// positions up to 1e5, where the angle must be computed in double. theta 0 = the vision
// encoder's base (2-D) or the decoder's (1-D); `spec` with a factor: Llama-3.x's scaling.
OpCase rope(int64_t T, int H, int hd, bool two_d, std::vector<int32_t> pos = {},
            std::vector<int32_t> row = {}, std::vector<int32_t> col = {}, RopeSpec spec = 0.0) {
  const std::string kind = !spec.mrope() ? "" : spec.mrope_restart ? " mrope-restart"
                           : spec.mrope_interleaved ? " mrope-interleaved" : " mrope-blocked";
  OpCase c = named(two_d ? "rope2d" : "rope", "T=" + str(T) + " H=" + str(H) + " hd=" + str(hd) +
                                                  (spec.scaled() ? " llama3" : "") + kind);
  if (spec.theta == 0.0) spec.theta = two_d ? 100.0 : 10000.0;  // the vision encoder's, the decoder's
  c.make = [=](Rng& r) {
    const int64_t n = T * H * hd;
    auto x = uniform(r, sz(n));
    // Under M-RoPE three positions a token (t, h, w).
    auto p = pos.empty() ? below(r, spec.mrope() ? 3 * T : T, 100000) : pos;
    auto rw = row.empty() ? below(r, T, 64) : row, cl = col.empty() ? below(r, T, 64) : col;
    auto dx = uniform(r, sz(n));
    return std::vector<Tensor>{act("x", x), bytes("pos", p), bytes("row", rw), bytes("col", cl),
                               act("dx", dx)};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    if (two_d)
      o.rope2d_forward(a.act("x"), a.as<int32_t>("row"), a.as<int32_t>("col"), T, H, hd, spec);
    else
      o.rope_forward(a.act("x"), a.as<int32_t>("pos"), T, H, hd, spec);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    if (two_d)
      o.rope2d_backward(a.act("dx"), a.as<int32_t>("row"), a.as<int32_t>("col"), T, H, hd, spec);
    else
      o.rope_backward(a.act("dx"), a.as<int32_t>("pos"), T, H, hd, spec);
  };
  c.checks = {{"x", kRope}, {"dx", kRope}};
  c.loss = [=](const Args& a) { return weighted(a, "x", "dx", sz(T * H * hd)); };
  c.grads = {{"x", "dx"}};
  c.flops_forward = c.flops_backward = 3.0 * double(T * H * hd);
  return c;
}

OpCase swiglu(int64_t n, float scale, bool alias_dh = false) {
  OpCase c = named(alias_dh ? "swiglu da aliasing dh" : "swiglu", "n=" + str(n));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{act("a", uniform(r, sz(n), scale)), act("b", uniform(r, sz(n), scale)),
                               act_out("h", sz(n)), act("dh", uniform(r, sz(n))),
                               act_out("da", sz(n)), act_out("db", sz(n))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.swiglu_forward(a.act("h"), a.act("a"), a.act("b"), n);
  };
  // The model reuses dh's buffer for da.
  const std::string da = alias_dh ? "dh" : "da";
  c.backward = [=](const Ops& o, const Args& a) {
    o.swiglu_backward(a.act(da), a.act("db"), a.act("dh"), a.act("a"), a.act("b"), n);
  };
  c.checks = {{"h", kPointwise}, {da, kPointwise}, {"db", kPointwise}};
  c.loss = [=](const Args& a) { return weighted(a, "h", "dh", sz(n)); };
  if (!alias_dh) c.grads = {{"a", "da"}, {"b", "db"}};
  c.flops_forward = 5.0 * double(n);
  c.flops_backward = 10.0 * double(n);
  return c;
}

OpCase gelu(int64_t n, float scale, GeluKind kind = GeluKind::Tanh) {
  OpCase c = named(std::string("gelu ") + gelu_kind_name(kind), "n=" + str(n));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{act("x", uniform(r, sz(n), scale)), act_out("y", sz(n)),
                               act("dy", uniform(r, sz(n))), act_out("dx", sz(n))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.gelu_forward(a.act("y"), a.act("x"), n, kind);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.gelu_backward(a.act("dx"), a.act("dy"), a.act("x"), n, kind);
  };
  c.checks = {{"y", kPointwise}, {"dx", kGeluGrad}};
  c.loss = [=](const Args& a) { return weighted(a, "y", "dy", sz(n)); };
  c.grads = {{"x", "dx"}};
  c.flops_forward = 8.0 * double(n);
  c.flops_backward = 16.0 * double(n);
  return c;
}

// Inputs of scale `scale` around `shift`: a large shift against a small spread is where a
// one-pass variance loses its digits. `frozen`: dw and db not computed (null).
OpCase layernorm(int64_t T, int64_t C, float scale = 1.0f, float shift = 0.0f, float eps = 1e-5f,
                 bool frozen = false) {
  std::string shape = str(T) + "x" + str(C);
  if (shift != 0.0f) shape += fmt::format(" shift={:g} scale={:g}", shift, scale);
  if (eps != 1e-5f) shape += fmt::format(" eps={:g}", eps);
  if (frozen) shape += " frozen";
  OpCase c = named("layernorm", shape);
  c.make = [=](Rng& r) {
    auto x = uniform(r, sz(T * C), scale);
    for (auto& v : x) v += shift;
    return std::vector<Tensor>{act("x", x), act("w", uniform(r, sz(C))),
                               act("b", uniform(r, sz(C))), act_out("y", sz(T * C)),
                               f32_out("mean", sz(T)), f32_out("rstd", sz(T)),
                               act("dy", uniform(r, sz(T * C))), act_out("dx", sz(T * C)),
                               f32("dw", uniform(r, sz(C))), f32("db", uniform(r, sz(C)))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.layernorm_forward(a.act("y"), a.f32("mean"), a.f32("rstd"), a.act("x"), a.act("w"),
                        a.act("b"), T, C, eps);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.layernorm_backward(a.act("dx"), frozen ? nullptr : a.f32("dw"),
                         frozen ? nullptr : a.f32("db"), a.act("dy"), a.act("x"), a.act("w"),
                         a.f32("mean"), a.f32("rstd"), T, C);
  };
  // The mean's error is relative to the shift (a float sum on the device, double on the CPU);
  // x - mean carries it, amplified by rstd ~ 1/scale, into y and dx.
  const double m = 1.0 + std::abs(double(shift)), k = 1.0 + std::abs(double(shift / scale));
  const OpTol mean_tol{{1e-6 * m, 1e-5}, {1e-6 * m, 1e-5}, {1e-6 * m, 1e-5}, {1e-6 * m, 1e-5}};
  const OpTol y_tol{{kRmsY.device_f32.atol * k, kRmsY.device_f32.rtol},
                    {kRmsY.device_bf16.atol * k, kRmsY.device_bf16.rtol},
                    {kRmsY.emulated_f32.atol * k, kRmsY.emulated_f32.rtol},
                    {kRmsY.emulated_bf16.atol * k, kRmsY.emulated_bf16.rtol}};
  OpTol dx_tol = rms_dx(C);
  for (Tol* t : {&dx_tol.device_f32, &dx_tol.device_bf16, &dx_tol.emulated_f32, &dx_tol.emulated_bf16})
    t->atol *= k;
  c.checks = {{"mean", mean_tol}, {"rstd", kRowStat}, {"y", y_tol}, {"dx", dx_tol},
              {"dw", rms_dw(T)}, {"db", rms_dw(T)}};
  c.loss = [=](const Args& a) { return weighted(a, "y", "dy", sz(T * C)); };
  c.grads = {{"x", "dx"}};
  if (!frozen) c.grads.insert(c.grads.end(), {{"w", "dw", true}, {"b", "db", true}});
  c.flops_forward = 7.0 * double(T * C);
  c.flops_backward = 12.0 * double(T * C);
  return c;
}

// LayerScale's per-column weight. `frozen`: dw not computed (null).
OpCase channel_scale(int64_t T, int64_t C, bool frozen = false) {
  OpCase c = named("channel_scale", str(T) + "x" + str(C) + (frozen ? " frozen" : ""));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{act("x", uniform(r, sz(T * C), 2.0f)), act("w", uniform(r, sz(C))),
                               act_out("y", sz(T * C)), act("dy", uniform(r, sz(T * C))),
                               act_out("dx", sz(T * C)), f32("dw", uniform(r, sz(C)))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.channel_scale_forward(a.act("y"), a.act("x"), a.act("w"), T, C);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.channel_scale_backward(a.act("dx"), frozen ? nullptr : a.f32("dw"), a.act("dy"), a.act("x"),
                             a.act("w"), T, C);
  };
  c.checks = {{"y", kPointwise}, {"dx", kPointwise}, {"dw", rms_dw(T)}};
  c.loss = [=](const Args& a) { return weighted(a, "y", "dy", sz(T * C)); };
  c.grads = {{"x", "dx"}};
  if (!frozen) c.grads.push_back({"w", "dw", true});
  c.flops_forward = double(T * C);
  c.flops_backward = 3.0 * double(T * C);
  return c;
}

// Which of vision_embed's gradients are computed.
enum class EmbedGrads { all, no_table, none };

// Images of the given patch grids in one encoder stream, with an untouched row between images
// (it must keep its value); the pretrained grid g0h x g0w, with or without the class row;
// resized bicubically (CLIP, SigLIP) or bilinearly (Qwen3-VL).
OpCase vision_embed(int g0h, int g0w, bool cls, const std::vector<std::pair<int, int>>& grids,
                    int64_t C, EmbedGrads grads = EmbedGrads::all, int probes = 300,
                    PosResize resize = PosResize::bicubic) {
  std::vector<PosImage> images;
  int64_t rows = 1, patches = 0;  // row 0 is a gap too
  std::string shape = fmt::format("g0={}x{}{} C={} grids", g0h, g0w, cls ? " cls" : "", C);
  for (auto [gh, gw] : grids) {
    images.push_back(PosImage{rows, gh, gw});
    rows += (cls ? 1 : 0) + int64_t(gh) * gw + 1;
    patches += int64_t(gh) * gw;
    shape += fmt::format(" {}x{}", gh, gw);
  }
  if (grads == EmbedGrads::no_table) shape += " frozen table";
  if (grads == EmbedGrads::none) shape += " frozen";
  if (resize == PosResize::bilinear_corners) shape += " bilinear";
  OpCase c = named("vision embed", shape);
  const int n = int(images.size());
  const int64_t n_pos = (cls ? 1 : 0) + int64_t(g0h) * g0w;
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{bytes("images", images), act("table", uniform(r, sz(n_pos * C))),
                               act("cls", uniform(r, sz(C))), act("x", uniform(r, sz(rows * C))),
                               act("dx", uniform(r, sz(rows * C))),
                               f32("dtable", uniform(r, sz(n_pos * C))),
                               f32("dcls", uniform(r, sz(C)))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.vision_embed_forward(a.act("x"), a.act("table"), cls ? a.act("cls") : CAct(),
                           a.as<PosImage>("images"), n, C, g0h, g0w, resize);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    float* dtable = grads == EmbedGrads::all ? a.f32("dtable") : nullptr;
    float* dcls = cls && grads != EmbedGrads::none ? a.f32("dcls") : nullptr;
    o.vision_embed_backward(dtable, dcls, a.act("dx"), a.as<PosImage>("images"), n, C, g0h, g0w, resize);
  };
  // Forward: 16 products summed in float in the same order everywhere; a device's fused
  // multiply-adds move each partial sum by an ulp. Backward: each table cell adds its terms in
  // the CPU's order on every backend; fused multiply-adds again, over up to ~16·patches/cells
  // terms per cell (more at clamped edges).
  const OpTol x_tol{{2e-6, 1e-5}, {2e-6, 0x1p-7 + 1e-5}, kHostPointwise, kStep};
  const Tol d{1e-7 * std::sqrt(16.0 * double(patches)) + 1e-6, 1e-5};
  c.checks = {{"x", x_tol}, {"dtable", {d, d, d, d}}, {"dcls", {d, d, d, d}}};
  c.loss = [=](const Args& a) { return weighted(a, "x", "dx", sz(rows * C)); };
  if (grads == EmbedGrads::all) c.grads.push_back({"table", "dtable", true, probes});
  if (cls && grads != EmbedGrads::none) c.grads.push_back({"cls", "dcls", true, probes});
  c.flops_forward = 32.0 * double(patches * C);
  c.flops_backward = 32.0 * double(patches * C);
  return c;
}

// Logits of scale 8 (3 for the gradient check); targets -1 one row in five unless given. Some
// rows' target is their argmax, so "correct" counts, and row 0 has a tie for its max (the first
// index wins, as on the CPU). The statistics buffer starts non-zero: the op adds to it. The
// gradient is written in place, as the model calls it.
OpCase cross_entropy(int64_t T, int64_t V, float scale = 8.0f, std::vector<int32_t> targets = {}) {
  OpCase c = named("cross-entropy", str(T) + "x" + str(V));
  const bool marked = targets.empty();
  c.make = [=](Rng& r) {
    auto logits = uniform(r, sz(T * V), scale);
    auto t = marked ? ids(r, T, V, 5) : targets;
    if (marked) {
      for (int64_t i = 0; i < T; i += 3)
        if (t[sz(i)] >= 0) logits[sz(i * V + t[sz(i)])] = 20.0f;
      if (V > 1) logits[sz(V - 1)] = logits[0] = 25.0f;
    }
    return std::vector<Tensor>{act("logits", logits), bytes("targets", t), f32_out("lse", sz(T)),
                               f64("stats", {1.5, 2.0, 1.0})};
  };
  const float grad_scale = marked ? 0.25f : 0.5f;
  c.forward = [=](const Ops& o, const Args& a) {
    o.cross_entropy_forward(a.f32("lse"), a.as<CrossEntropyStats>("stats"), a.act("logits"),
                            a.as<int32_t>("targets"), T, V);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.cross_entropy_backward(a.act("logits"), a.act("logits"), a.f32("lse"),
                             a.as<int32_t>("targets"), T, V, grad_scale);
  };
  c.checks = {{"lse", kLse}, {"stats", ce_stats(T)}, {"logits", kDlogits}};
  // The backward pass scales by grad_scale: its loss is that part of the sum.
  c.loss = [=](const Args& a) {
    return grad_scale * (a.as<CrossEntropyStats>("stats")->loss_sum - 1.5);
  };
  c.grads = {{"logits", "logits"}};
  c.flops_forward = 4.0 * double(T * V);
  c.flops_backward = 3.0 * double(T * V);
  return c;
}

// Few distinct ids: many repeats, so the backward's ordering is exercised; some -1. The table's
// gradient accumulates; each table row adds its tokens' rows in token order, as on the CPU.
OpCase embedding(int64_t T, int64_t C, int64_t V, std::vector<int32_t> given = {}) {
  OpCase c = named("embedding", "T=" + str(T) + " C=" + str(C) + " V=" + str(V));
  c.make = [=](Rng& r) {
    auto i = given.empty() ? ids(r, T, V, 7) : given;
    return std::vector<Tensor>{bytes("ids", i), act("table", uniform(r, sz(V * C))),
                               act_out("out", sz(T * C)), act("dout", uniform(r, sz(T * C))),
                               f32("dtable", uniform(r, sz(V * C)))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.embedding_forward(a.act("out"), a.as<int32_t>("ids"), a.act("table"), T, C);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.embedding_backward(a.f32("dtable"), a.act("dout"), a.as<int32_t>("ids"), T, C);
  };
  c.checks = {{"out", kExact}, {"dtable", kExact}};
  c.loss = [=](const Args& a) { return weighted(a, "out", "dout", sz(T * C)); };
  c.grads = {{"table", "dtable", true, 200}};
  return c;
}

// Every other row of T takes a source row, in a random order.
OpCase rows(int64_t T, int64_t C) {
  OpCase c = named("scatter/gather rows", "T=" + str(T) + " C=" + str(C));
  const int64_t n = T / 2 + 1;
  c.make = [=](Rng& r) {
    std::vector<int32_t> slot(sz(T), -1), perm(sz(n));
    for (int64_t i = 0; i < n; ++i) perm[sz(i)] = int32_t(i);
    for (int64_t i = n - 1; i > 0; --i) std::swap(perm[sz(i)], perm[r.below(uint64_t(i + 1))]);
    for (int64_t i = 0, t = 0; i < n && t < T; ++i, t += 2) slot[sz(t)] = perm[sz(i)];
    return std::vector<Tensor>{bytes("slot", slot), act("src", uniform(r, sz(n * C))),
                               act("y", uniform(r, sz(T * C))), act("dy", uniform(r, sz(T * C))),
                               act("dsrc", uniform(r, sz(n * C)))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.scatter_rows(a.act("y"), a.act("src"), a.as<int32_t>("slot"), T, C);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.gather_rows(a.act("dsrc"), a.act("dy"), a.as<int32_t>("slot"), T, C);
  };
  c.checks = {{"y", kExact}, {"dsrc", kExact}};
  return c;
}

// Images of grids given in merged blocks (gh, gw); the patch grid is m times larger.
OpCase patch_merge(int m, const std::vector<std::pair<int, int>>& grids, int64_t C,
                   int probes = 40) {
  std::vector<MergeImage> images;
  int64_t P = 0;
  std::string shape = "m=" + str(m) + " C=" + str(C) + " grids";
  for (auto [gh, gw] : grids) {
    images.push_back(MergeImage{P, gh * m, gw * m});
    P += int64_t(gh * m) * (gw * m);
    shape += ' ' + str(gh) + 'x' + str(gw);
  }
  OpCase c = named("patch merge", shape);
  const int n = int(images.size());
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{bytes("images", images), act("in", uniform(r, sz(P * C))),
                               act_out("out", sz(P * C)), act("dout", uniform(r, sz(P * C))),
                               act_out("din", sz(P * C))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.patch_merge_forward(a.act("out"), a.act("in"), a.as<MergeImage>("images"), n, C, m);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.patch_merge_backward(a.act("din"), a.act("dout"), a.as<MergeImage>("images"), n, C, m);
  };
  c.checks = {{"out", kExact}, {"din", kExact}};
  c.loss = [=](const Args& a) { return weighted(a, "out", "dout", sz(P * C)); };
  c.grads = {{"in", "din", false, probes}};
  return c;
}

// The vector ops on n elements from `off` elements into their buffers: one float off 16-byte
// alignment takes the scalar paths. y += x; then y (fp32) *= s; acc (fp32) += x; fill; cast.
OpCase vector_ops(int64_t n, int64_t off = 0) {
  OpCase c = named("vector ops", "n=" + str(n) + (off ? " off=" + str(off) : ""));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{act("y", uniform(r, sz(n + off))), act("x", uniform(r, sz(n + off))),
                               f32("s", uniform(r, sz(n + off))), f32("acc", uniform(r, sz(n + off))),
                               act_out("filled", sz(n + off)), f32("master", uniform(r, sz(n + off))),
                               act_out("cast", sz(n + off))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.add_inplace(a.act("y") + off, a.act("x") + off, n);
    o.scale_inplace(a.f32("s") + off, 0.37f, n);
    o.accumulate(a.f32("acc") + off, a.act("x") + off, n);
    o.fill(a.act("filled") + off, -2.5f, n);
    o.cast(a.act("cast") + off, a.f32("master") + off, n);
  };
  c.checks = {{"y", kExact}, {"s", kExact}, {"acc", kExact}, {"filled", kExact}, {"cast", kExact}};
  return c;
}

OpCase sum_squares(int64_t n) {
  OpCase c = named("sum_squares", "n=" + str(n));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{f32("x", uniform(r, sz(n))), f64("out", {7.0})};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.sum_squares(a.as<double>("out"), a.f32("x"), n);
  };
  c.checks = {{"out", kSumSquares}};
  c.storage = false;
  return c;
}

// Three steps, the second without weight decay; `off` as in vector_ops.
OpCase adamw(int64_t n, int64_t off = 0) {
  OpCase c = named("adamw", "n=" + str(n) + (off ? " off=" + str(off) : ""));
  c.make = [=](Rng& r) {
    auto v = uniform(r, sz(n + off), 0.1f);
    for (auto& e : v) e = std::abs(e);
    return std::vector<Tensor>{f32("p", uniform(r, sz(n + off))), f32("g", uniform(r, sz(n + off))),
                               f32("m", uniform(r, sz(n + off), 0.1f)), f32("v", v)};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    for (int64_t t = 1; t <= 3; ++t) {
      const AdamWStep s{1e-3f, 0.9f, 0.95f, 1e-8f, t == 2 ? 0.0f : 0.1f, t};
      o.adamw_update(a.f32("p") + off, a.f32("g") + off, a.f32("m") + off, a.f32("v") + off, n, s);
    }
  };
  c.checks = {{"p", kAdamW}, {"m", kAdamW}, {"v", kAdamW}};
  c.storage = false;
  return c;
}

// Random 8-bit pixels: every backend computes the spec's fp32 formula with the same IEEE
// operations, so the same bits before the storage's one rounding.
OpCase pixels(int64_t n) {
  OpCase c = named("pixels", "n=" + str(n));
  c.make = [=](Rng& r) {
    std::vector<uint8_t> px(sz(n));
    for (auto& p : px) p = uint8_t(r.below(256));
    return std::vector<Tensor>{bytes("px", px), act_out("y", sz(n))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    const PixelNorm norm{{0.48f, 0.45f, 0.40f}, {0.27f, 0.26f, 0.28f}};
    o.normalize_pixels(a.act("y"), a.as<uint8_t>("px"), n, norm);
  };
  c.checks = {{"y", kExact}};
  return c;
}

// Ring attention's merge of a partial result (in the storage) into the fp32 running one.
OpCase attention_merge(int64_t T, int H, int hd) {
  OpCase c = named("attention merge", "T=" + str(T) + " H=" + str(H) + " hd=" + str(hd));
  c.make = [=](Rng& r) {
    const size_t n = sz(T * H * hd), m = sz(T * H);
    return std::vector<Tensor>{act("part", uniform(r, n)), f32("out", uniform(r, n)),
                               f32("lse", uniform(r, m, 4.0f)), f32("part_lse", uniform(r, m, 4.0f))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.attention_merge(a.f32("out"), a.f32("lse"), a.act("part"), a.f32("part_lse"), T, H, hd);
  };
  const OpTol t{kRowReduce, kRowReduce, kRowReduce, kRowReduce};
  c.checks = {{"out", t}, {"lse", t}};
  return c;
}

// The bias gradient alone (no dx, so no W; no dW, so no x): a column sum of dy.
OpCase bias_gradient(int64_t T, int64_t C) {
  OpCase c = named("linear bias gradient", "T=" + str(T) + " C=" + str(C));
  c.make = [=](Rng& r) {
    return std::vector<Tensor>{act("dy", uniform(r, sz(T * C))), f32("db", std::vector<float>(sz(C), 0.5f))};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.linear_backward(Act(), nullptr, a.f32("db"), a.act("dy"), CAct(), CAct(), T, C, C, false);
  };
  c.checks = {{"db", kColumnSum}};
  return c;
}

}  // namespace

std::vector<OpCase> grad_cases() {
  return {linear(6, 5, 4),
          rmsnorm(4, 8, 2.0f),
          rmsnorm(4, 8, 0.05f, 1e-2f),
          rope(5, 2, 8, false, {0, 1, 7, 2, 30}, {}, {}, 100.0),
          rope(5, 2, 8, true, {}, {0, 0, 1, 3, 2}, {0, 1, 0, 4, 5}),
          rope(5, 2, 8, false, {0, 1, 7, 2, 300}, {}, {}, llama3_rope()),
          rope(4, 2, 12, false, {0, 0, 0, 5, 5, 6, 5, 6, 5, 9, 9, 9}, {}, {}, mrope(2, 2, 2, true, 100.0)),
          rope(4, 2, 12, false, {0, 0, 0, 5, 5, 6, 5, 6, 5, 9, 9, 9}, {}, {}, mrope(3, 2, 1, false, 100.0)),
          rope(4, 2, 12, false, {0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 3, 2}, {}, {}, mrope(0, 3, 3, false, 100.0, true)),
          swiglu(30, 3.0f),
          gelu(30, 4.0f),
          gelu(30, 4.0f, GeluKind::Erf),
          gelu(30, 4.0f, GeluKind::Quick),
          layernorm(4, 8, 2.0f),
          layernorm(3, 7, 0.5f, 3.0f, 1e-2f),
          layernorm(3, 5, 1.0f, 0.0f, 1e-5f, true),
          channel_scale(4, 8),
          channel_scale(3, 5, true),
          // Up, down, non-square, a side of 1, the pretrained size itself; with and without the
          // class row; several images; frozen gradients.
          vision_embed(3, 4, true, {{5, 7}, {2, 3}, {3, 4}}, 3),
          vision_embed(4, 4, false, {{1, 6}, {9, 2}}, 5),
          vision_embed(5, 3, true, {{1, 1}, {4, 8}}, 2, EmbedGrads::no_table),
          vision_embed(2, 2, false, {{3, 5}, {2, 2}}, 1),
          vision_embed(4, 4, false, {{1, 6}, {9, 2}, {4, 4}}, 5, EmbedGrads::all, 300, PosResize::bilinear_corners),
          vision_embed(5, 3, false, {{1, 1}, {2, 7}}, 3, EmbedGrads::all, 300, PosResize::bilinear_corners),
          cross_entropy(5, 7, 3.0f, {2, -1, 6, 0, -1}),
          embedding(7, 20, 6, {3, 1, -1, 3, 0, 5, 3}),
          patch_merge(2, {{1, 2}, {1, 1}}, 3, 100)};
}

std::vector<OpCase> device_cases() {
  std::vector<OpCase> v;
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {5, 7}, {64, 256}, {37, 1000}, {300, 1000},
                      {300, 2048}})
    v.push_back(rmsnorm(T, C));
  v.push_back(rmsnorm(37, 1000, 0.05f, 1e-2f));
  for (auto [T, H, hd] : {std::tuple<int64_t, int, int>{1, 1, 2}, {9, 3, 8}, {70, 4, 64},
                          {33, 2, 128}, {300, 4, 128}}) {
    v.push_back(rope(T, H, hd, false));
    if (hd % 4 == 0) v.push_back(rope(T, H, hd, true));
  }
  v.push_back(rope(70, 4, 64, false, {}, {}, {}, llama3_rope()));
  v.push_back(rope(300, 4, 128, false, {}, {}, {}, llama3_rope()));
  v.push_back(rope(300, 4, 128, false, {}, {}, {}, mrope(24, 20, 20, true)));   // Qwen3-VL's sections
  v.push_back(rope(300, 4, 128, false, {}, {}, {}, mrope(16, 24, 24, false)));  // Qwen2.5-VL's
  v.push_back(rope(300, 16, 64, false, {}, {}, {}, mrope(0, 16, 16, false, 10000.0, true)));  // its towers
  // Qwen3's q/k norms: rows of one head.
  v.push_back(rmsnorm(300 * 16, 128));
  for (int64_t n : {1, 3, 1000, 4097, 100003, 300 * 2048}) {
    v.push_back(swiglu(n, 4.0f));
    for (GeluKind k : {GeluKind::Tanh, GeluKind::Erf, GeluKind::Quick}) v.push_back(gelu(n, 4.0f, k));
    v.push_back(swiglu(n, 4.0f, true));
  }
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {5, 7}, {64, 256}, {37, 1000}, {300, 1024},
                      {577, 1024}})
    v.push_back(layernorm(T, C));
  v.push_back(layernorm(37, 1000, 0.5f, 8.0f, 1e-6f));
  v.push_back(layernorm(300, 1024, 1.0f, 0.0f, 1e-5f, true));
  // InternViT-300M's width (1024) over a 448 tile's patches and its class row.
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {5, 7}, {1025, 1024}, {300, 1000}})
    v.push_back(channel_scale(T, C));
  v.push_back(channel_scale(37, 1000, true));
  // CLIP ViT-L/14-336's grid (24 x 24 + the class row) to native-resolution grids, SigLIP's
  // (no class row) and odd ones; widths across channel blocks.
  v.push_back(vision_embed(24, 24, true, {{24, 24}, {17, 31}, {40, 12}, {1, 9}}, 1024));
  v.push_back(vision_embed(16, 16, false, {{27, 20}, {8, 8}, {16, 16}}, 1152));
  v.push_back(vision_embed(3, 5, true, {{1, 1}, {7, 2}, {30, 45}}, 37, EmbedGrads::no_table));
  v.push_back(vision_embed(7, 6, false, {{5, 9}}, 300, EmbedGrads::none));
  // Qwen3-VL's 48 x 48 table at width 1024, bilinear, on grids below, at and above it.
  v.push_back(vision_embed(48, 48, false, {{48, 48}, {20, 64}, {1, 3}, {70, 30}}, 1024, EmbedGrads::all, 300,
                           PosResize::bilinear_corners));
  for (auto [T, V] : {std::pair<int64_t, int64_t>{1, 2}, {17, 23}, {64, 1000}, {64, 32000},
                      {130, 32000}, {5000, 37}})
    v.push_back(cross_entropy(T, V));
  for (auto [T, C, V] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {50, 7, 5}, {600, 64, 300},
                         {1000, 130, 20}, {300, 1000, 500}})
    v.push_back(embedding(T, C, V));
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {40, 9}, {513, 256}, {300, 1000}})
    v.push_back(rows(T, C));
  for (int m : {1, 2, 3}) v.push_back(patch_merge(m, {{1, 2}, {3, 3}, {2, 1}, {6, 15}}, 5));
  v.push_back(patch_merge(2, {{2, 3}, {1, 1}}, 48));
  for (int64_t n : {1, 5, 1024, 100001, 300000, 3000000}) {
    v.push_back(vector_ops(n));
    v.push_back(sum_squares(n));
  }
  v.push_back(vector_ops(100, 1));
  for (int64_t n : {1, 7, 100003}) v.push_back(adamw(n));
  v.push_back(pixels(3 * 100003 + 2));
  v.push_back(attention_merge(300, 3, 80));
  return v;
}

std::vector<OpCase> emulated_cases() {
  std::vector<OpCase> v;
  // Rows shorter than, equal to and longer than a warp (up to 512 columns a warp per row, 8 rows
  // to a block, the last block ragged) and a block (wider rows); dw's 16 row lanes and 32-column
  // tiles exactly filled and with tails, and cut into row slices (1100 rows: 3 slices).
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 300}, {40, 33}, {16, 256},
                      {2, 512}, {37, 300}, {3, 700}, {1100, 33}})
    v.push_back(rmsnorm(T, C));
  v.push_back(rmsnorm(5, 300, 0.05f, 1e-2f));  // the eps argument reaches the kernel
  for (auto [T, H, hd] : {std::tuple<int64_t, int, int>{1, 1, 2}, {9, 3, 8}, {13, 2, 10},
                          {70, 4, 64}, {11, 1, 128}, {37, 3, 64}}) {
    v.push_back(rope(T, H, hd, false));
    if (hd % 4 == 0) v.push_back(rope(T, H, hd, true));
  }
  v.push_back(rope(13, 2, 10, false, {}, {}, {}, llama3_rope()));
  v.push_back(rope(37, 3, 64, false, {}, {}, {}, llama3_rope()));
  v.push_back(rope(37, 3, 64, false, {}, {}, {}, mrope(12, 10, 10, true)));
  v.push_back(rope(13, 2, 12, false, {}, {}, {}, mrope(2, 2, 2, false)));
  v.push_back(rope(37, 3, 64, false, {}, {}, {}, mrope(0, 16, 16, false, 10000.0, true)));
  // Qwen3's q/k norms: rows of one head (T·H rows of hd), fewer values than threads.
  v.push_back(rmsnorm(37 * 3, 16));
  // Around the block of 256 threads.
  for (int64_t n : {1, 3, 255, 256, 257, 1000, 4097, 37 * 1000}) {
    v.push_back(swiglu(n, 4.0f));
    for (GeluKind k : {GeluKind::Tanh, GeluKind::Erf, GeluKind::Quick}) v.push_back(gelu(n, 4.0f, k));
    v.push_back(swiglu(n, 4.0f, true));
  }
  // Rows shorter than, equal to and longer than the block; dw and db's row lanes and column
  // tiles exactly filled and with tails.
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {5, 300}, {40, 33}, {16, 256},
                      {37, 300}})
    v.push_back(layernorm(T, C));
  v.push_back(layernorm(5, 300, 0.5f, 8.0f, 1e-2f));
  v.push_back(layernorm(40, 33, 1.0f, 0.0f, 1e-5f, true));
  // Channels below, at and across the block; images with more patches than slices.
  v.push_back(vision_embed(4, 4, true, {{4, 4}, {6, 9}, {1, 3}}, 5));
  v.push_back(vision_embed(3, 5, false, {{7, 2}, {2, 11}}, 130));
  v.push_back(vision_embed(5, 3, true, {{1, 1}, {9, 4}}, 33, EmbedGrads::no_table));
  v.push_back(vision_embed(2, 3, false, {{3, 3}}, 7, EmbedGrads::none));
  v.push_back(vision_embed(6, 6, false, {{6, 6}, {2, 11}, {1, 1}, {13, 4}}, 33, EmbedGrads::all, 300,
                           PosResize::bilinear_corners));
  // V = 1000, 2052, 512 and 4 take the vector path of the backward pass, the others the scalar.
  for (auto [T, V] : {std::pair<int64_t, int64_t>{1, 2}, {17, 23}, {6, 1000}, {5, 2052}, {9, 1537},
                      {3, 512}, {4, 4}, {37, 203}})
    v.push_back(cross_entropy(T, V));
  // T > 256 takes the backward pass through several tiles of matches (V = 1: one id matches
  // every row, one more than a tile); C > 256 strides columns.
  for (auto [T, C, V] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {50, 7, 5}, {300, 33, 20},
                         {40, 300, 3}, {256, 4, 2}, {257, 3, 1}, {37, 300, 50}})
    v.push_back(embedding(T, C, V));
  for (auto [T, C] : {std::pair<int64_t, int64_t>{1, 1}, {40, 9}, {33, 300}, {37, 300}})
    v.push_back(rows(T, C));
  // 6 x 15 at m = 3 has more patches than the kernel's slices per image, so slices take several.
  for (int m : {1, 2, 3})
    for (int64_t C : {5, 260}) v.push_back(patch_merge(m, {{1, 2}, {3, 3}, {6, 15}}, C));
  for (int64_t n : {1, 5, 1024, 4099, 4100, 37 * 300})
    for (int64_t off : {0, 1}) v.push_back(vector_ops(n, off));
  for (int64_t n : {1, 7, 1001})
    for (int64_t off : {0, 1}) v.push_back(adamw(n, off));
  v.push_back(pixels(3 * 1000 + 1));
  v.push_back(bias_gradient(37, 300));
  return v;
}

std::vector<OpCase> perf_cases(const PerfShape& s) {
  std::vector<int32_t> pos(s.pos, s.pos + s.T);
  OpCase sw = swiglu(s.T * s.ffn, 1.0f);
  sw.shape = str(s.T) + "x" + str(s.ffn);
  // Qwen3's q_norm: every (token, head) row of head_dim.
  OpCase qn = rmsnorm(s.T * s.H, s.hd);
  qn.shape += " (q_norm)";
  return {rmsnorm(s.T, s.d), qn, layernorm(s.T, s.d), rope(s.T, s.H, s.hd, false, pos), sw,
          cross_entropy(s.T, s.V)};
}

OpCase linear_case(int64_t T, int64_t in, int64_t out) { return linear(T, in, out, false); }

OpCase attention_case(const std::string& what, const std::vector<int32_t>& doc,
                      const std::vector<int32_t>& idx, const std::vector<int32_t>& blk,
                      int64_t pairs, int Hq, int Hkv, int hd) {
  const int64_t T = int64_t(doc.size());
  OpCase c = named("attention", "T=" + str(T) + " Hq=" + str(Hq) + " Hkv=" + str(Hkv) +
                                    " hd=" + str(hd) + ", " + what);
  const AttnShape s{T, T, Hq, Hkv, hd, float(1.0 / std::sqrt(double(hd)))};
  c.make = [=](Rng& r) {
    const size_t nq = sz(T * Hq * hd), nk = sz(T * Hkv * hd);
    return std::vector<Tensor>{bytes("doc", doc), bytes("idx", idx), bytes("blk", blk),
                               act("q", uniform(r, nq)), act("k", uniform(r, nk)),
                               act("v", uniform(r, nk)), act_out("out", nq),
                               f32_out("lse", sz(T * Hq)), act("dout", uniform(r, nq)),
                               act_out("dq", nq), act_out("dk", nk), act_out("dv", nk)};
  };
  auto meta = [](const Args& a) {
    return AttnMeta{a.as<int32_t>("doc"), a.as<int32_t>("idx"), a.as<int32_t>("blk")};
  };
  c.forward = [=](const Ops& o, const Args& a) {
    o.attention_forward(a.act("out"), a.f32("lse"), a.act("q"), a.act("k"), a.act("v"), meta(a),
                        meta(a), s);
  };
  c.backward = [=](const Ops& o, const Args& a) {
    o.attention_backward(a.act("dq"), a.act("dk"), a.act("dv"), a.act("dout"), a.act("out"),
                         a.f32("lse"), a.act("q"), a.act("k"), a.act("v"), meta(a), meta(a), s);
  };
  // Only the pairs the mask allows: Q·Kᵀ and P·V forward; dP, dV, dS·K and dSᵀ·Q backward.
  c.flops_forward = 4.0 * double(pairs) * hd * Hq;
  c.flops_backward = 2.0 * c.flops_forward;
  return c;
}

}  // namespace dhp::testing
