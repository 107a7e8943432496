// GFLOP/s of every CPU op family on the shapes of the demo model, a 4x wider one and a long
// sequence, side by side with the GEMM's on the same machine in the same run.
//
//   bench_kernels [--threads 1] [--isa best|avx512|avx2|generic] [--min-seconds 0.2]
//                 [--filter attention]
//
// Busy time is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so other processes on
// a shared machine slow the figures less than wall time would; with --threads above 1 it
// under-counts and the figures are not comparable. Each op repeats until min-seconds of CPU
// time have passed; the best of three such trials is printed.
//
// FLOPs counted (nominal, per call):
//   linear        fwd 2·T·in·out, bwd 4·T·in·out (dx and dW)
//   attention     only the (query, key) pairs the mask allows: fwd 4·pairs·hd per head
//                 (Q·Kᵀ and P·V), bwd 8·pairs·hd (dP, dV, dS·K, dSᵀ·Q); the recomputed
//                 scores and the exponentials are not counted
//   rmsnorm       fwd 4·T·C, bwd 8·T·C;  rope 6 per rotated pair;  swiglu fwd 5, bwd 10 per
//   element;  cross-entropy fwd 4·T·V, bwd 3·T·V. The pointwise ops are memory-bound: their
//   GFLOP/s only say how far they sit from the GEMM.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/clock.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_tuning.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

namespace {

using namespace dhp;
using namespace dhp::cpu;


double g_min_seconds = 0.2;
std::string g_filter;  // only rows whose "op shape" contains it (the GEMM row always runs)

// Seconds per call of one trial: repeats until g_min_seconds of CPU time have passed.
double trial(const std::function<void()>& f) {
  int n = 0;
  const double t0 = thread_cpu_seconds();
  double t = t0;
  do {
    f();
    ++n;
    t = thread_cpu_seconds();
  } while (t - t0 < g_min_seconds);
  return (t - t0) / n;
}

struct Timing {
  double op, gemm;  // best seconds per call of the op and of the GEMM
};

// Three trials of the op, each followed by one of the GEMM, best of each: the load of a shared
// machine drifts, so the op is compared with the GEMM measured at the same moments.
Timing time_op(const std::function<void()>& f, const std::function<void()>& gemm) {
  f();  // warm-up: first-touch page faults and caches
  Timing best{1e30, 1e30};
  for (int k = 0; k < 3; ++k) {
    best.op = std::min(best.op, trial(f));
    if (gemm) best.gemm = std::min(best.gemm, trial(gemm));
  }
  if (!gemm) best.gemm = best.op;
  return best;
}

std::vector<float> randn(std::mt19937& rng, size_t n, float s = 1.0f) {
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Row {
  std::string op, shape;
  double flops;
  Timing t;
};

// Rows of one model's shapes; the first row added is the GEMM every other row is compared with.
struct Table {
  explicit Table(std::string t) : title(std::move(t)) {}
  std::string title;
  std::function<void()> gemm;
  double gemm_flops = 0;
  std::vector<Row> rows;
  void add(std::string op, std::string shape, double flops, const std::function<void()>& f) {
    if (!rows.empty() && (op + " " + shape).find(g_filter) == std::string::npos) return;
    rows.push_back({std::move(op), std::move(shape), flops, time_op(f, gemm)});
  }
  void print() const {
    fmt::print("\n## {}\n\n| op | shape | ms/call | GFLOP/s | GEMM GFLOP/s meanwhile | % of GEMM |\n"
               "|---|---|---:|---:|---:|---:|\n",
               title);
    for (const auto& r : rows) {
      const double gf = r.flops / r.t.op / 1e9, gemm_gf = gemm_flops / r.t.gemm / 1e9;
      fmt::print("| {} | {} | {:.3f} | {:.1f} | {:.1f} | {:.0f}% |\n", r.op, r.shape, r.t.op * 1e3,
                 gf, gemm_gf, 100.0 * gf / gemm_gf);
    }
  }
};

// Per-token mask metadata of a pack of documents; blk >= 0 makes a document bidirectional.
struct Pack {
  std::vector<int32_t> doc, idx, blk, row, col;
  int64_t pairs = 0;  // visible (query, key) pairs
  int64_t size() const { return int64_t(doc.size()); }
  AttnMeta meta() const { return {doc.data(), idx.data(), blk.data()}; }
};

Pack causal_pack(std::mt19937& rng, int64_t T, int lo, int hi) {
  Pack p;
  int32_t d = 0;
  while (p.size() < T) {
    const int64_t len = std::min<int64_t>(T - p.size(), std::uniform_int_distribution<int>(lo, hi)(rng));
    for (int64_t i = 0; i < len; ++i) {
      p.doc.push_back(d);
      p.idx.push_back(int32_t(i));
      p.blk.push_back(-1);
      p.row.push_back(0);
      p.col.push_back(0);
    }
    p.pairs += len * (len + 1) / 2;
    ++d;
  }
  return p;
}

// Images of random even grids (sides lo..hi patches), each one bidirectional block.
Pack image_pack(std::mt19937& rng, int64_t T, int lo, int hi) {
  Pack p;
  int32_t d = 0;
  std::uniform_int_distribution<int> side(lo / 2, hi / 2);
  while (p.size() < T) {
    const int gh = 2 * side(rng), gw = 2 * side(rng);
    const int64_t len = std::min<int64_t>(T - p.size(), int64_t(gh) * gw);
    for (int64_t i = 0; i < len; ++i) {
      p.doc.push_back(d);
      p.idx.push_back(int32_t(i));
      p.blk.push_back(d);
      p.row.push_back(int32_t(i / gw));
      p.col.push_back(int32_t(i % gw));
    }
    p.pairs += len * len;
    ++d;
  }
  return p;
}

void bench_gemm(Table& t, std::mt19937& rng, int64_t T, int64_t in, int64_t out) {
  auto x = randn(rng, size_t(T * in)), W = randn(rng, size_t(out * in)), y = randn(rng, size_t(T * out));
  // Kept alive by the table: every later row times this GEMM between its own trials.
  auto keep = std::make_shared<std::vector<std::vector<float>>>(
      std::vector<std::vector<float>>{randn(rng, size_t(T * in)), randn(rng, size_t(out * in)),
                                      std::vector<float>(size_t(T * out))});
  t.gemm = [keep, T, in, out] {
    auto& v = *keep;
    linear_forward(v[2].data(), v[0].data(), v[1].data(), nullptr, T, in, out);
  };
  t.gemm_flops = 2.0 * T * in * out;
  t.add("gemm (linear fwd)", fmt::format("{}x{} -> {}", T, in, out), t.gemm_flops, t.gemm);
  auto dW = std::vector<float>(size_t(out * in), 0.0f), dx = randn(rng, size_t(T * in));
  t.add("linear bwd", fmt::format("{}x{} -> {}", T, in, out), 4.0 * T * in * out, [&] {
    linear_backward(dx.data(), dW.data(), nullptr, y.data(), x.data(), W.data(), T, in, out);
  });
}

void bench_attention(Table& t, std::mt19937& rng, const Pack& p, int Hq, int Hkv, int hd,
                     const std::string& what) {
  const int64_t T = p.size();
  const AttnShape s{T, T, Hq, Hkv, hd, float(1.0 / std::sqrt(double(hd)))};
  auto q = randn(rng, size_t(T * Hq * hd)), k = randn(rng, size_t(T * Hkv * hd)),
       v = randn(rng, size_t(T * Hkv * hd)), dout = randn(rng, size_t(T * Hq * hd));
  std::vector<float> out(q.size()), lse(size_t(Hq * T)), dq(q.size()), dk(k.size()), dv(v.size());
  const std::string shape = fmt::format("T={} Hq={} Hkv={} hd={}, {}", T, Hq, Hkv, hd, what);
  const double fwd = 4.0 * double(p.pairs) * hd * Hq;
  t.add("attention fwd", shape, fwd, [&] {
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p.meta(), p.meta(), s);
  });
  t.add("attention bwd", shape, 2 * fwd, [&] {
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), p.meta(), p.meta(), s);
  });
}

void bench_pointwise(Table& t, std::mt19937& rng, const Pack& p, int64_t d, int H, int hd,
                     int64_t ffn, int64_t V) {
  const int64_t T = p.size();
  auto x = randn(rng, size_t(T * d)), w = randn(rng, size_t(d)), y = randn(rng, size_t(T * d)),
       dx = randn(rng, size_t(T * d)), dw = std::vector<float>(size_t(d), 0.0f);
  std::vector<float> rstd(static_cast<size_t>(T));
  const std::string td = fmt::format("{}x{}", T, d);
  t.add("rmsnorm fwd", td, 4.0 * T * d,
        [&] { rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), T, d); });
  t.add("rmsnorm bwd", td, 8.0 * T * d, [&] {
    rmsnorm_backward(dx.data(), dw.data(), y.data(), x.data(), w.data(), rstd.data(), T, d);
  });
  auto qh = randn(rng, size_t(T * H * hd));
  const std::string th = fmt::format("T={} H={} hd={}", T, H, hd);
  t.add("rope fwd", th, 3.0 * T * H * hd,
        [&] { rope_forward(qh.data(), p.idx.data(), T, H, hd, 0, hd, 10000.0); });
  t.add("rope bwd", th, 3.0 * T * H * hd,
        [&] { rope_backward(qh.data(), p.idx.data(), T, H, hd, 0, hd, 10000.0); });
  auto a = randn(rng, size_t(T * ffn)), b = randn(rng, size_t(T * ffn)),
       h = randn(rng, size_t(T * ffn)), da = randn(rng, size_t(T * ffn)),
       db = randn(rng, size_t(T * ffn));
  const std::string tf = fmt::format("{}x{}", T, ffn);
  t.add("swiglu fwd", tf, 5.0 * T * ffn, [&] { swiglu_forward(h.data(), a.data(), b.data(), T * ffn); });
  t.add("swiglu bwd", tf, 10.0 * T * ffn, [&] {
    swiglu_backward(da.data(), db.data(), h.data(), a.data(), b.data(), T * ffn);
  });
  auto logits = randn(rng, size_t(T * V)), dlogits = randn(rng, size_t(T * V));
  std::vector<float> lse(static_cast<size_t>(T));
  std::vector<int32_t> targets(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) targets[size_t(i)] = int32_t(i % V);
  const std::string tv = fmt::format("{}x{}", T, V);
  t.add("cross-entropy fwd", tv, 4.0 * T * V,
        [&] { cross_entropy_forward(lse.data(), logits.data(), targets.data(), T, V); });
  t.add("cross-entropy bwd", tv, 3.0 * T * V, [&] {
    cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), T, V, 1.0f);
  });
}

struct Model {
  std::string name;
  int64_t d, ffn, V;
  int H, Hkv, hd;
  int64_t vdim, vffn;
  int vheads;
};

void bench_model(const Model& m, int64_t T, int64_t patches) {
  std::mt19937 rng(1234);
  Table t(fmt::format("{}: decoder d={} heads={}/{} hd={} ffn={}, vision dv={} heads={} hd={}",
                      m.name, m.d, m.H, m.Hkv, m.hd, m.ffn, m.vdim, m.vheads, m.vdim / m.vheads));
  bench_gemm(t, rng, T, m.d, m.ffn);
  // The demo's samples: one image of up to 64 merged tokens plus a caption, ~60..140 tokens.
  // Packs from their own seed: both models see the same documents and images.
  std::mt19937 pack_rng(7);
  const Pack text = causal_pack(pack_rng, T, 60, 140);
  bench_attention(t, rng, text, m.H, m.Hkv, m.hd, "causal documents of 60..140");
  // Its vision input: images of 4..16 x 4..16 patches (32..128 pixels at patch 8).
  const Pack images = image_pack(pack_rng, patches, 4, 16);
  bench_attention(t, rng, images, m.vheads, m.vheads, int(m.vdim / m.vheads),
                  "image blocks of 4..16 x 4..16 patches");
  bench_pointwise(t, rng, text, m.d, m.H, m.hd, m.ffn, m.V);
  t.print();
}

void bench_long() {
  std::mt19937 rng(99);
  const int64_t T = 4096;
  Table t("long sequence: one causal document of 4096 tokens, head dim 64");
  bench_gemm(t, rng, T, 256, 1024);
  bench_attention(t, rng, causal_pack(rng, T, int(T), int(T)), 4, 2, 64, "one causal document");
  t.print();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GFLOP/s of the CPU kernels against the GEMM"};
  int threads = 1;
  std::string isa = "best";
  app.add_option("--threads", threads, "OpenMP threads (1 for comparable figures)");
  app.add_option("--isa", isa, "attention variant")->check(CLI::IsMember({"best", "avx512", "avx2", "generic"}));
  app.add_option("--min-seconds", g_min_seconds, "CPU seconds per trial");
  app.add_option("--filter", g_filter, "only the rows whose op and shape contain this");
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(threads);
  set_blas_threads(1);
  set_attention_isa(isa == "avx512"  ? AttnIsa::avx512
                    : isa == "avx2"  ? AttnIsa::avx2
                    : isa == "generic" ? AttnIsa::generic
                                       : AttnIsa::best);
  const AttnIsa used = attention_isa();
  fmt::print("threads={} attention isa={}\n", threads,
             used == AttnIsa::avx512 ? "avx512" : used == AttnIsa::avx2 ? "avx2" : "generic");
  bench_model({"demo (configs/demo.toml)", 128, 320, 160, 4, 2, 32, 64, 160, 4}, 1024, 2048);
  bench_model({"4x wider", 512, 1280, 160, 16, 8, 32, 256, 640, 16}, 1024, 2048);
  bench_long();
}
