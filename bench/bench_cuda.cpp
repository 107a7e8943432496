// Throughput of the CUDA backend, one JSON line per measurement:
//   {"bench":"gemm","op":"fwd","M":4096,"N":5632,"K":2048,"precision":"bf16","tflops":...}
//   {"bench":"train_step","config":"1b","tokens":4096,"precision":"bf16","tokens_per_s":...,
//    "mfu":...,"peak_tflops":989}
//
//   bench_cuda [--precision fp32,tf32,bf16] [--only gemm|train] [--layers 22] [--iters 10]
//
// GEMMs: the Linear layers of the ~1B decoder below at 4096 tokens (M = tokens, N = out,
// K = in; "fwd" y = x·Wᵀ, "dx" dy·W, "dw" dW += dyᵀ·x), and the lm_head at the model's
// 1024-row logit chunks. 2·M·N·K flops each.
// Training step: forward, backward and AdamW on one 4096-token pack of 4 text documents of
// 1024 tokens (the vision encoder is built but idle). Model flops per step = 6·N·tokens with
// N the parameters the step multiplies by (decoder blocks and lm_head; not the embedding
// table, which is a lookup, nor the idle vision path), plus causal attention
// 12·layers·q_dim·pairs (forward Q·Kᵀ and P·V 4·pairs·q_dim, backward twice that).
// MFU divides by the H200's dense peak for the precision: bf16 989 TFLOP/s, tf32 494,
// fp32 67 (no tensor cores).
// Times are cudaEvent intervals on the backend's stream after warm-up; the median is printed.
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "model/model.h"

namespace {

using namespace dhp;

double peak_tflops(const std::string& precision) {
  return precision == "bf16" ? 989.0 : precision == "tf32" ? 494.0 : 67.0;
}

// The ~1B decoder: TinyLlama-like widths, grouped-query attention, a small vision encoder.
ModelConfig config_1b(int layers) {
  ModelConfig c;
  c.dim = 2048;
  c.layers = layers;
  c.heads = 16;
  c.kv_heads = 8;
  c.ffn = 5632;
  c.vocab_size = 32000;
  c.rope_theta = 10000.0;
  c.vision.patch = 14;
  c.vision.dim = 256;
  c.vision.layers = 2;
  c.vision.heads = 4;
  c.vision.ffn = 1024;
  c.vision.merge = 2;
  return c;
}

// Median milliseconds of `iters` runs of f on the backend's stream, after `warmup` runs.
double time_ms(CudaBackend& be, int warmup, int iters, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  be.synchronize();
  cudaEvent_t start, stop;
  DHP_CUDA_CHECK(cudaEventCreate(&start));
  DHP_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    DHP_CUDA_CHECK(cudaEventRecord(start, be.stream()));
    f();
    DHP_CUDA_CHECK(cudaEventRecord(stop, be.stream()));
    DHP_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    DHP_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Precision precision_of(const std::string& name) {
  const std::optional<Precision> p = find_precision(name);
  if (!p) throw std::runtime_error("--precision: unknown '" + name + "' (fp32, tf32, bf16)");
  return *p;
}

void bench_gemms(const std::string& precision, int iters) {
  BackendOptions opt;
  opt.precision = precision_of(precision);
  CudaBackend be(opt);
  const ModelConfig c = config_1b(1);
  const int64_t T = 4096, d = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), F = c.ffn;
  struct Shape {
    int64_t M, N, K;  // tokens, out, in
  };
  const std::vector<Shape> shapes = {{T, qd, d},  {T, kvd, d}, {T, d, qd},
                                     {T, F, d},   {T, d, F},   {1024, c.vocab_size, d}};
  // x, W and y in the precision's storage (bf16 for "bf16"), dW in fp32: as the model runs them.
  const DType t = be.ops().dtype();
  const size_t es = dtype_size(t);
  for (const Shape& s : shapes) {
    DeviceBuffer x(be, es * size_t(s.M * s.K)), W(be, es * size_t(s.N * s.K));
    DeviceBuffer y(be, es * size_t(s.M * s.N)), dW(be, sizeof(float) * size_t(s.N * s.K));
    const Act X(x.data(), t), Wt(W.data(), t), Y(y.data(), t);
    be.ops().fill(X, 0.5f, s.M * s.K);
    be.ops().fill(Wt, 0.25f, s.N * s.K);
    be.ops().fill(Y, 0.125f, s.M * s.N);
    be.ops().fill(dW.as<float>(), 0.0f, s.N * s.K);
    const auto& ops = be.ops();
    const std::vector<std::pair<std::string, std::function<void()>>> runs = {
        {"fwd", [&] { ops.linear_forward(Y, X, Wt, nullptr, s.M, s.K, s.N); }},
        {"dx", [&] { ops.linear_backward(X, nullptr, nullptr, Y, X, Wt, s.M, s.K, s.N, false); }},
        {"dw", [&] {
           ops.linear_backward(Act(), dW.as<float>(), nullptr, Y, X, Wt, s.M, s.K, s.N, false);
         }},
    };
    for (const auto& [op, f] : runs) {
      const double ms = time_ms(be, 3, iters, f);
      const double tflops = 2.0 * double(s.M) * double(s.N) * double(s.K) / (ms * 1e-3) / 1e12;
      fmt::print("{{\"bench\":\"gemm\",\"op\":\"{}\",\"M\":{},\"N\":{},\"K\":{},\"precision\":\"{}\","
                 "\"ms\":{:.4f},\"tflops\":{:.2f}}}\n",
                 op, s.M, s.N, s.K, precision, ms, tflops);
      std::fflush(stdout);
    }
  }
}

// Four documents of 1024 tokens, every position with a target.
Batch text_batch(int64_t docs, int64_t len, int32_t vocab) {
  Batch b;
  uint32_t h = 12345;
  for (int64_t di = 0; di < docs; ++di) {
    for (int64_t t = 0; t < len; ++t) {
      h = h * 1664525u + 1013904223u;
      const int32_t tok = int32_t(h % uint32_t(vocab));
      b.tokens.push_back(tok);
      b.doc.push_back(int32_t(di));
      b.pos.push_back(int32_t(t));
      b.image_slot.push_back(-1);
    }
    b.sample_ids.push_back(di);
  }
  b.T = int64_t(b.tokens.size());
  for (int64_t t = 0; t < b.T; ++t)
    b.targets.push_back(t + 1 < b.T && b.doc[t + 1] == b.doc[t] ? b.tokens[t + 1] : -1);
  return b;
}

void bench_train_step(const std::string& precision, int layers, int iters) {
  BackendOptions opt;
  opt.precision = precision_of(precision);
  CudaBackend be(opt);
  const ModelConfig cfg = config_1b(layers);
  Model model(cfg, be);
  model.initialise(1);
  const int64_t n = model.n_params();
  DeviceBuffer m(be, sizeof(float) * size_t(n)), v(be, sizeof(float) * size_t(n));
  be.zero(m.data(), m.bytes());
  be.zero(v.data(), v.bytes());
  const int64_t docs = 4, len = 1024;
  const Batch b = text_batch(docs, len, cfg.vocab_size);
  const DeviceBatch& db = model.upload(b);
  const float scale = 1.0f / float(b.loss_tokens());
  int64_t step = 0;
  auto train_step = [&] {
    model.zero_grads();
    model.run(db, scale, true);
    const AdamWStep s{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++step};
    be.ops().adamw_update(model.params(), model.grads(), m.as<float>(), v.as<float>(), n, s);
  };
  const double ms = time_ms(be, 2, iters, train_step);

  int64_t unused = 0;
  for (const auto& spec : model.table().specs())
    if (spec.name.rfind("vision.", 0) == 0 || spec.name.rfind("projector.", 0) == 0 ||
        spec.name == "tok_embed.weight")
      unused += spec.numel();
  const double N = double(n - unused), tokens = double(b.T);
  const double pairs = double(docs) * double(len) * double(len + 1) / 2.0;
  const double flops = 6.0 * N * tokens + 12.0 * cfg.layers * double(cfg.q_dim()) * pairs;
  const double tokens_per_s = tokens / (ms * 1e-3);
  const double mfu = flops / (ms * 1e-3) / (peak_tflops(precision) * 1e12);
  fmt::print("{{\"bench\":\"train_step\",\"config\":\"1b\",\"layers\":{},\"params\":{},"
             "\"tokens\":{},\"precision\":\"{}\",\"ms\":{:.2f},\"tokens_per_s\":{:.0f},"
             "\"mfu\":{:.4f},\"peak_tflops\":{:.0f}}}\n",
             cfg.layers, n, b.T, precision, ms, tokens_per_s, mfu, peak_tflops(precision));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CUDA backend throughput: GEMMs and a ~1B training step, as JSON lines"};
  std::string precisions = "fp32,tf32,bf16", only;
  int layers = 22, iters = 10;
  app.add_option("--precision", precisions, "comma-separated: fp32, tf32, bf16");
  app.add_option("--only", only, "gemm or train (default: both)")->check(CLI::IsMember({"gemm", "train"}));
  app.add_option("--layers", layers, "decoder layers of the ~1B config")->check(CLI::Range(1, 64));
  app.add_option("--iters", iters, "timed repetitions (the median is printed)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  const CudaStatus st = cuda_status();
  if (st.devices == 0) {
    std::fprintf(stderr, "bench_cuda: no usable CUDA device (%s); nothing to measure\n",
                 st.reason.c_str());
    return 1;
  }
  std::fprintf(stderr, "bench_cuda: %s\n", st.name.c_str());
  try {
    std::stringstream list(precisions);
    std::string p;
    while (std::getline(list, p, ',')) {
      if (only.empty() || only == "gemm") bench_gemms(p, iters);
      if (only.empty() || only == "train") bench_train_step(p, layers, iters);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
  return 0;
}
