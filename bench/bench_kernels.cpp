// GFLOP/s of every CPU op family on the shapes of the demo model, a 4x wider one (head dims
// 32/16 as the demo's, and 64), a long document and a 16k-token mixed pack, side by side with the GEMM's on the same machine in the same run. The ops, their
// inputs and FLOP counts are rows of the op table (tests/ops_table), called through the CPU
// backend's Ops.
//
//   bench_kernels [--threads 1] [--isa best|avx512|avx2|generic] [--min-seconds 0.2]
//                 [--filter attention]
//
// Busy time is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so other processes on
// a shared machine slow the figures less than wall time would; with --threads above 1 it
// under-counts and the figures are not comparable. Every table's title names the machine's
// L2 cache per core, which decides how far the short-document attention rows are from the GEMM. Each op repeats until min-seconds of CPU
// time have passed; the best of three such trials is printed.
//
// FLOPs counted (nominal, per call):
//   linear        fwd 2·T·in·out, bwd 4·T·in·out (dx and dW)
//   attention     only the (query, key) pairs the mask allows: fwd 4·pairs·hd per head
//                 (Q·Kᵀ and P·V), bwd 8·pairs·hd (dP, dV, dS·K, dSᵀ·Q); the recomputed
//                 scores and the exponentials are not counted
//   rmsnorm       fwd 4·T·C, bwd 8·T·C;  layernorm fwd 7·T·C, bwd 12·T·C;
//   rope 6 per rotated pair;  swiglu fwd 5, bwd 10 per
//   element;  cross-entropy fwd 4·T·V, bwd 3·T·V. The pointwise ops are memory-bound: their
//   GFLOP/s only say how far they sit from the GEMM.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/clock.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention_tuning.h"
#include "tests/ops_table/op_table.h"

namespace {

using namespace dhp;
using namespace dhp::cpu;


double g_min_seconds = 0.2;
std::string g_l2;  // "L2 1024 KiB per core", printed with every table
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
    fmt::print("\n## {} ({})\n\n| op | shape | ms/call | GFLOP/s | GEMM GFLOP/s meanwhile | % of GEMM |\n"
               "|---|---|---:|---:|---:|---:|\n",
               title, g_l2);
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

// A long pack of two kinds of documents, in random order: the demo's samples (an image block of
// 16..64 tokens, then a caption of 20..80 tokens that sees the whole image causally) and text
// documents of 1024..4096 tokens.
Pack mixed_pack(std::mt19937& rng, int64_t T) {
  Pack p;
  int32_t d = 0;
  std::uniform_int_distribution<int> kind(0, 3), image(16, 64), caption(20, 80), text(1024, 4096);
  while (p.size() < T) {
    const bool sample = kind(rng) != 0;
    const int64_t b = sample ? image(rng) : 0;
    const int64_t len = std::min<int64_t>(T - p.size(), sample ? b + caption(rng) : text(rng));
    const int64_t nb = std::min(b, len), c = len - nb;
    for (int64_t i = 0; i < len; ++i) {
      p.doc.push_back(d);
      p.idx.push_back(int32_t(i));
      p.blk.push_back(i < nb ? d : -1);
      p.row.push_back(0);
      p.col.push_back(0);
    }
    // The block sees itself; caption token i (1-based) sees the block and i caption tokens.
    p.pairs += nb * nb + c * nb + c * (c + 1) / 2;
    ++d;
  }
  return p;
}

// Times one row of the op table (tests/ops_table) on the fp32 CPU reference: its forward pass
// as "<op> fwd" and, after one forward pass for its inputs, its backward pass as "<op> bwd".
void bench_row(Table& t, const Ops& ops, const testing::OpCase& c) {
  testing::HostBuffers b(c.tensors(), DType::F32);
  const testing::Args a = b.args();
  t.add(c.op + " fwd", c.shape, c.flops_forward, [&] { c.forward(ops, a); });
  if (!c.backward) return;
  c.forward(ops, a);
  t.add(c.op + " bwd", c.shape, c.flops_backward, [&] { c.backward(ops, a); });
}

// The table's first rows: the Linear layer's GEMM, which every later row's trials alternate
// with, and its backward pass.
void bench_gemm(Table& t, const Ops& ops, int64_t T, int64_t in, int64_t out) {
  const testing::OpCase c = testing::linear_case(T, in, out);
  auto b = std::make_shared<testing::HostBuffers>(c.tensors(), DType::F32);
  t.gemm = [b, c, &ops] { c.forward(ops, b->args()); };
  t.gemm_flops = c.flops_forward;
  t.add("gemm (linear fwd)", c.shape, t.gemm_flops, t.gemm);
  t.add("linear bwd", c.shape, c.flops_backward, [&] { c.backward(ops, b->args()); });
}

void bench_attention(Table& t, const Ops& ops, const Pack& p, int Hq, int Hkv, int hd,
                     const std::string& what) {
  bench_row(t, ops, testing::attention_case(what, p.doc, p.idx, p.blk, p.pairs, Hq, Hkv, hd));
}

struct Model {
  std::string name;
  int64_t d, ffn, V;
  int H, Hkv, hd;
  int64_t vdim, vffn;
  int vheads;
};

void bench_model(const Ops& ops, const Model& m, int64_t T, int64_t patches) {
  Table t(fmt::format("{}: decoder d={} heads={}/{} hd={} ffn={}, vision dv={} heads={} hd={}",
                      m.name, m.d, m.H, m.Hkv, m.hd, m.ffn, m.vdim, m.vheads, m.vdim / m.vheads));
  bench_gemm(t, ops, T, m.d, m.ffn);
  // The demo's samples: one image of up to 64 merged tokens plus a caption, ~60..140 tokens.
  // Packs from their own seed: both models see the same documents and images.
  std::mt19937 pack_rng(7);
  const Pack text = causal_pack(pack_rng, T, 60, 140);
  bench_attention(t, ops, text, m.H, m.Hkv, m.hd, "causal documents of 60..140");
  // Its vision input: images of 4..16 x 4..16 patches (32..128 pixels at patch 8).
  const Pack images = image_pack(pack_rng, patches, 4, 16);
  bench_attention(t, ops, images, m.vheads, m.vheads, int(m.vdim / m.vheads),
                  "image blocks of 4..16 x 4..16 patches");
  // Rope at the text pack's positions.
  for (const auto& c : testing::perf_cases({T, m.d, m.ffn, m.V, m.H, m.hd, text.idx.data()}))
    bench_row(t, ops, c);
  t.print();
}

void bench_long(const Ops& ops) {
  std::mt19937 rng(99);
  const int64_t T = 4096;
  Table t("long sequences, head dim 64: one causal document of 4096 tokens, a 16k-token mixed pack");
  bench_gemm(t, ops, T, 256, 1024);
  bench_attention(t, ops, causal_pack(rng, T, int(T), int(T)), 4, 2, 64, "one causal document");
  bench_attention(t, ops, mixed_pack(rng, 4 * T), 8, 4, 64,
                  "mixed pack: image+caption samples of 36..144 and text of 1k..4k");
  t.print();
}

// The L2 cache of one core, from the C library or else from sysfs.
std::string l2_size() {
  long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (bytes <= 0) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index2/size");
    std::string s;
    if (f >> s && !s.empty()) {
      const char unit = s.back();
      bytes = std::stol(s) * (unit == 'K' ? 1024L : unit == 'M' ? 1024L * 1024 : 1L);
    }
  }
  return bytes > 0 ? fmt::format("L2 {} KiB per core", bytes / 1024) : "L2 size unknown";
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
  BackendOptions opt;
  opt.threads = threads;
  const auto cpu = make_cpu_backend(opt);  // sets the OpenMP threads and single-threaded BLAS
  set_attention_isa(isa == "avx512"  ? AttnIsa::avx512
                    : isa == "avx2"  ? AttnIsa::avx2
                    : isa == "generic" ? AttnIsa::generic
                                       : AttnIsa::best);
  const AttnIsa used = attention_isa();
  g_l2 = l2_size();
  fmt::print("threads={} attention isa={} {}\n", threads,
             used == AttnIsa::avx512 ? "avx512" : used == AttnIsa::avx2 ? "avx2" : "generic", g_l2);
  const Ops& ops = cpu->ops();
  bench_model(ops, {"demo (configs/demo.toml)", 128, 320, 160, 4, 2, 32, 64, 160, 4}, 1024, 2048);
  bench_model(ops, {"4x wider", 512, 1280, 160, 16, 8, 32, 256, 640, 16}, 1024, 2048);
  bench_model(ops, {"4x wider, head dim 64", 512, 1280, 160, 8, 4, 64, 256, 640, 4}, 1024, 2048);
  bench_long(ops);
}
