// Time of the CUDA attention kernels, ours and cuDNN's fused attention, on the shapes the
// trainer runs, one JSON line per shape and implementation:
//   {"bench":"attention","impl":"own"|"cudnn","math":"fp32"|"tf32"|"bf16","kind":..,
//    "causal":true|false,"T":..,"docs":..,"doc_lens":[..],"Hq":..,"Hkv":..,"hd":..,
//    "fwd_ms":..,"bwd_ms":..,"fwd_tflops":..,"bwd_tflops":..,"tflops":..}
// Kinds: "decoder packed" (causal documents of uneven lengths, one or four), "vision" (images
// of one encoder pack, each a bidirectional block), "long" (one causal document of 32k
// tokens). The document lengths are printed so that another framework's fused attention can
// be timed on the same shapes (scripts/gpu_torch_bench.py).
//
//   bench_cuda_attention [--reps 20] [--warmup 3] [--filter T=8192]
//                        [--math fp32|tf32|bf16|all] [--impl own|cudnn|all]
//
// FLOPs count only the visible (query, key) pairs: per causal document n·(n+1)/2, per image
// n²; forward 4·visible·hd·Hq (Q·Kᵀ and P·V), backward 2.5 times that (five products against
// two: the recomputed Q·Kᵀ, dP, dV, dK and dQ), FlashAttention's convention. "tflops" is
// forward plus backward over their summed time. Times are CUDA event times per call, the mean
// over --reps calls after --warmup; cuDNN's first call (its plan) is in the warm-up.
#include <CLI/CLI.hpp>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/attention_runs.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/storage.cuh"

namespace {

struct Shape {
  std::string kind;
  int64_t T;
  std::vector<int64_t> docs;  // lengths, summing to T
  int Hq, Hkv, hd;
  bool causal = true;         // causal documents, or images (bidirectional blocks)
};

// One document, or four of uneven lengths (40%, 30%, 20%, 10% of the tokens).
std::vector<int64_t> doc_lengths(int64_t T, int n) {
  if (n == 1) return {T};
  std::vector<int64_t> d{T * 4 / 10, T * 3 / 10, T * 2 / 10};
  d.push_back(T - d[0] - d[1] - d[2]);
  return d;
}

class DevBuf {
 public:
  explicit DevBuf(size_t bytes) { DHP_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 1))); }
  DevBuf(DevBuf&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(p_); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

template <class T>
DevBuf upload(const std::vector<T>& h) {
  DevBuf b(h.size() * sizeof(T));
  DHP_CUDA_CHECK(cudaMemcpy(b.as<void>(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return b;
}

std::vector<float> random_floats(std::mt19937& g, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

template <class F>
double mean_ms(int warmup, int reps, F f, cudaStream_t stream = nullptr) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  DHP_CUDA_CHECK(cudaEventCreate(&a));
  DHP_CUDA_CHECK(cudaEventCreate(&b));
  DHP_CUDA_CHECK(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) f();
  DHP_CUDA_CHECK(cudaEventRecord(b, stream));
  DHP_CUDA_CHECK(cudaEventSynchronize(b));
  float ms = 0;
  DHP_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  DHP_CUDA_CHECK(cudaEventDestroy(a));
  DHP_CUDA_CHECK(cudaEventDestroy(b));
  return double(ms) / reps;
}

// The values of v in the storage S.
template <class S>
std::vector<S> stored(const std::vector<float>& v) {
  std::vector<S> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = dhp::cuda::st<S>(v[i]);
  return out;
}

// The metadata of a shape: documents (causal) or images (doc = blk = image, idx 0), as the
// model builds them (model/device_batch.cpp), with the visible pairs they hold.
struct HostMeta {
  std::vector<int32_t> doc, idx, blk;
  std::vector<dhp::AttnRun> runs;
  int64_t visible = 0;
  explicit HostMeta(const Shape& sh) {
    for (size_t d = 0; d < sh.docs.size(); ++d) {
      for (int64_t i = 0; i < sh.docs[d]; ++i) {
        doc.push_back(int32_t(d));
        idx.push_back(sh.causal ? int32_t(i) : 0);
        blk.push_back(sh.causal ? -1 : int32_t(d));
      }
      visible += sh.causal ? sh.docs[d] * (sh.docs[d] + 1) / 2 : sh.docs[d] * sh.docs[d];
    }
    dhp::attention_runs(runs, doc.data(), idx.data(), blk.data(), sh.T);
  }
};

// One shape's device buffers: inputs from a fixed seed, outputs, metadata.
template <class S>
struct Buffers {
  DevBuf ddoc, didx, dblk, q, k, v, dout, out, lse, dq, dk, dv;
  Buffers(const Shape& sh, const HostMeta& h, std::mt19937& g)
      : ddoc(upload(h.doc)),
        didx(upload(h.idx)),
        dblk(upload(h.blk)),
        q(upload(stored<S>(random_floats(g, size_t(sh.T * sh.Hq * sh.hd))))),
        k(upload(stored<S>(random_floats(g, size_t(sh.T * sh.Hkv * sh.hd))))),
        v(upload(stored<S>(random_floats(g, size_t(sh.T * sh.Hkv * sh.hd))))),
        dout(upload(stored<S>(random_floats(g, size_t(sh.T * sh.Hq * sh.hd))))),
        out(sizeof(S) * size_t(sh.T * sh.Hq * sh.hd)),
        lse(sizeof(float) * size_t(sh.T * sh.Hq)),
        dq(sizeof(S) * size_t(sh.T * sh.Hq * sh.hd)),
        dk(sizeof(S) * size_t(sh.T * sh.Hkv * sh.hd)),
        dv(sizeof(S) * size_t(sh.T * sh.Hkv * sh.hd)) {}
};

void report(const Shape& sh, const HostMeta& h, const char* impl, const char* math, double fwd, double bwd) {
  const double fwd_flops = 4.0 * double(h.visible) * sh.hd * sh.Hq, bwd_flops = 2.5 * fwd_flops;
  fmt::print(
      "{{\"bench\":\"attention\",\"impl\":\"{}\",\"math\":\"{}\",\"kind\":\"{}\",\"causal\":{},\"T\":{},"
      "\"docs\":{},\"doc_lens\":[{}],\"Hq\":{},\"Hkv\":{},\"hd\":{},\"fwd_ms\":{:.4f},\"bwd_ms\":{:.4f},"
      "\"fwd_tflops\":{:.3f},\"bwd_tflops\":{:.3f},\"tflops\":{:.3f}}}\n",
      impl, math, sh.kind, sh.causal, sh.T, sh.docs.size(), fmt::join(sh.docs, ","), sh.Hq, sh.Hkv, sh.hd, fwd, bwd,
      fwd_flops / fwd * 1e-9, bwd_flops / bwd * 1e-9, (fwd_flops + bwd_flops) / (fwd + bwd) * 1e-9);
  std::fflush(stdout);
}

// Our kernel. S: the storage of the head vectors (float, or bf16 on tensor cores whatever
// `math` says).
template <class S>
void bench_own(const Shape& sh, dhp::cuda::AttnMath math, int warmup, int reps) {
  const HostMeta h(sh);
  std::mt19937 g(1);
  const Buffers<S> b(sh, h, g);
  const dhp::AttnMeta m{b.ddoc.template as<int32_t>(), b.didx.template as<int32_t>(), b.dblk.template as<int32_t>()};
  const dhp::AttnShape s{sh.T, sh.T, sh.Hq, sh.Hkv, sh.hd, float(1.0 / std::sqrt(double(sh.hd)))};
  const double fwd = mean_ms(warmup, reps, [&] {
    dhp::cuda::attention_forward(nullptr, b.out.template as<S>(), b.lse.template as<float>(), b.q.template as<S>(),
                                 b.k.template as<S>(), b.v.template as<S>(), m, m, s, math);
  });
  const double bwd = mean_ms(warmup, reps, [&] {
    dhp::cuda::attention_backward(nullptr, b.dq.template as<S>(), b.dk.template as<S>(), b.dv.template as<S>(),
                                  b.dout.template as<S>(), b.out.template as<S>(), b.lse.template as<float>(),
                                  b.q.template as<S>(), b.k.template as<S>(), b.v.template as<S>(), m, m, s, math);
  });
  report(sh, h, "own",
         !std::is_same_v<S, float> ? "bf16" : math == dhp::cuda::AttnMath::tf32 ? "tf32" : "fp32", fwd, bwd);
}

// cuDNN's fused attention on the same shape, bf16, through the backend's own path.
void bench_cudnn(dhp::Backend& backend, dhp::cuda::CudnnAttention& lib, const Shape& sh, int warmup, int reps) {
  using dhp::cuda::bf16;
  const HostMeta h(sh);
  std::mt19937 g(1);
  const Buffers<bf16> b(sh, h, g);
  const dhp::AttnRuns runs{h.runs.data(), int64_t(h.runs.size())};
  const dhp::AttnMeta m{b.ddoc.as<int32_t>(), b.didx.as<int32_t>(), b.dblk.as<int32_t>(), runs};
  const dhp::AttnShape s{sh.T, sh.T, sh.Hq, sh.Hkv, sh.hd, float(1.0 / std::sqrt(double(sh.hd)))};
  auto a = [](const DevBuf& x) { return dhp::Act(x.as<void>(), dhp::DType::BF16); };
  const auto stream = static_cast<cudaStream_t>(backend.stream_handle());
  bool ran = true;
  const double fwd = mean_ms(warmup, reps, [&] {
    ran = lib.forward(a(b.out), b.lse.as<float>(), a(b.q), a(b.k), a(b.v), m, m, s) && ran;
  }, stream);
  const double bwd = mean_ms(warmup, reps, [&] {
    ran = lib.backward(a(b.dq), a(b.dk), a(b.dv), a(b.dout), a(b.out), b.lse.as<float>(), a(b.q), a(b.k), a(b.v), m,
                       m, s) && ran;
  }, stream);
  if (!ran) {
    fmt::print(stderr, "bench_cuda_attention: cuDNN did not run {} T={} hd={} (see the log above)\n", sh.kind, sh.T,
               sh.hd);
    return;
  }
  report(sh, h, "cudnn", "bf16", fwd, bwd);
}

}  // namespace

// The shapes: decoder packs (one or four documents, GQA or not, head dims 128 and 64), one
// vision encoder pack (16 images of 1,024 patches, head dim 80 as Qwen2-VL's tower, or 64),
// and one long document.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int64_t T : {4096, 8192})
    for (int ndocs : {1, 4})
      for (int Hkv : {8, 16})
        for (int hd : {128, 64}) out.push_back({"decoder packed", T, doc_lengths(T, ndocs), 16, Hkv, hd});
  for (int hd : {80, 64}) out.push_back({"vision", 16 * 1024, std::vector<int64_t>(16, 1024), 16, 16, hd, false});
  out.push_back({"long", 32768, {32768}, 32, 8, 128});
  return out;
}

int main(int argc, char** argv) {
  CLI::App app{"Time of the CUDA attention kernels, ours and cuDNN's, on the trainer's shapes"};
  int reps = 20, warmup = 3;
  std::string filter, math = "all", impl = "all";
  app.add_option("--reps", reps, "timed calls per shape and pass");
  app.add_option("--warmup", warmup, "untimed calls first");
  app.add_option("--filter", filter,
                 "only shapes whose description (e.g. 'decoder packed T=8192 docs=4 Hq=16 Hkv=8 hd=128') contains "
                 "this");
  app.add_option("--math", math, "our kernel: fp32, tf32 (fp32 storage, tensor cores), bf16 (bf16 storage) or all")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "all"}));
  app.add_option("--impl", impl, "own, cudnn (bf16) or all")->check(CLI::IsMember({"own", "cudnn", "all"}));
  CLI11_PARSE(app, argc, argv);
  const dhp::CudaStatus st = dhp::cuda_status();
  if (st.devices == 0) {
    fmt::print(stderr, "bench_cuda_attention: no CUDA device ({})\n", st.reason);
    return 1;
  }
  fmt::print(stderr, "device: {}\n", st.name);
  try {
    dhp::BackendOptions o;
    o.precision = dhp::Precision::bf16;
    o.attention = dhp::AttentionImpl::cudnn;
    const auto backend = dhp::make_cuda_backend(o);
    dhp::cuda::CudnnAttention lib(*backend, static_cast<cudaStream_t>(backend->stream_handle()));
    for (const Shape& sh : shapes()) {
      const std::string name =
          fmt::format("{} T={} docs={} Hq={} Hkv={} hd={}", sh.kind, sh.T, sh.docs.size(), sh.Hq, sh.Hkv, sh.hd);
      if (name.find(filter) == std::string::npos) continue;
      if (impl != "cudnn") {
        // fp32 SIMT on 32k-token documents takes minutes: the long shape runs bf16 only.
        if ((math == "fp32" || math == "all") && sh.kind != "long")
          bench_own<float>(sh, dhp::cuda::AttnMath::fp32, warmup, reps);
        if ((math == "tf32" || math == "all") && sh.kind != "long")
          bench_own<float>(sh, dhp::cuda::AttnMath::tf32, warmup, reps);
        if (math == "bf16" || math == "all") bench_own<dhp::cuda::bf16>(sh, dhp::cuda::AttnMath::tf32, warmup, reps);
      }
      if (impl != "own") bench_cudnn(*backend, lib, sh, warmup, reps);
    }
  } catch (const dhp::Error& e) {
    fmt::print(stderr, "bench_cuda_attention: {}\n", e.what());
    return 1;
  }
  return 0;
}
