// Time of the CUDA attention kernels on packed causal shapes, one JSON line per shape:
//   {"bench":"attention","math":"fp32","T":..,"docs":..,"doc_lens":[..],"Hq":..,"Hkv":..,
//    "hd":..,"fwd_ms":..,"bwd_ms":..,"fwd_tflops":..,"bwd_tflops":..,"tflops":..}
// The document lengths are printed so that another framework's fused attention can be timed
// on the same shapes.
//
//   bench_cuda_attention [--reps 20] [--warmup 3] [--filter T=8192]
//                        [--math fp32|tf32|bf16|all]
//
// FLOPs count only the visible (query, key) pairs of the causal mask, the sum over documents
// of n·(n+1)/2: forward 4·visible·hd·Hq (Q·Kᵀ and P·V), backward 2.5 times that (five products
// against two: the recomputed Q·Kᵀ, dP, dV, dK and dQ), FlashAttention's convention. "tflops"
// is forward plus backward over their summed time. Times are CUDA event times per call, the
// mean over --reps calls after --warmup.
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
#include "kernels/cuda/launch.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/storage.cuh"

namespace {

struct Shape {
  int64_t T;
  std::vector<int64_t> docs;  // lengths, summing to T
  int Hq, Hkv, hd;
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
double mean_ms(int warmup, int reps, F f) {
  for (int i = 0; i < warmup; ++i) f();
  cudaEvent_t a, b;
  DHP_CUDA_CHECK(cudaEventCreate(&a));
  DHP_CUDA_CHECK(cudaEventCreate(&b));
  DHP_CUDA_CHECK(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f();
  DHP_CUDA_CHECK(cudaEventRecord(b));
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

// S: the storage of the head vectors (float, or bf16 on tensor cores whatever `math` says).
template <class S>
void bench(const Shape& sh, dhp::cuda::AttnMath math, int warmup, int reps) {
  std::vector<int32_t> doc, idx, blk(size_t(sh.T), -1);
  int64_t visible = 0;
  for (size_t d = 0; d < sh.docs.size(); ++d) {
    for (int64_t i = 0; i < sh.docs[d]; ++i) {
      doc.push_back(int32_t(d));
      idx.push_back(int32_t(i));
    }
    visible += sh.docs[d] * (sh.docs[d] + 1) / 2;
  }
  std::mt19937 g(1);
  const size_t nq = size_t(sh.T * sh.Hq * sh.hd), nk = size_t(sh.T * sh.Hkv * sh.hd);
  const DevBuf ddoc = upload(doc), didx = upload(idx), dblk = upload(blk);
  const DevBuf q = upload(stored<S>(random_floats(g, nq))),
               k = upload(stored<S>(random_floats(g, nk))),
               v = upload(stored<S>(random_floats(g, nk))),
               dout = upload(stored<S>(random_floats(g, nq)));
  const size_t es = sizeof(S);
  const DevBuf out(nq * es), lse(size_t(sh.T * sh.Hq) * 4), dq(nq * es), dk(nk * es), dv(nk * es);
  const dhp::AttnMeta m{ddoc.as<int32_t>(), didx.as<int32_t>(), dblk.as<int32_t>()};
  const dhp::AttnShape s{sh.T, sh.T, sh.Hq, sh.Hkv, sh.hd, float(1.0 / std::sqrt(double(sh.hd)))};
  const double fwd = mean_ms(warmup, reps, [&] {
    dhp::cuda::attention_forward(nullptr, out.as<S>(), lse.as<float>(), q.as<S>(), k.as<S>(),
                                 v.as<S>(), m, m, s, math);
  });
  const double bwd = mean_ms(warmup, reps, [&] {
    dhp::cuda::attention_backward(nullptr, dq.as<S>(), dk.as<S>(), dv.as<S>(), dout.as<S>(),
                                  out.as<S>(), lse.as<float>(), q.as<S>(), k.as<S>(), v.as<S>(), m,
                                  m, s, math);
  });
  const double fwd_flops = 4.0 * double(visible) * sh.hd * sh.Hq, bwd_flops = 2.5 * fwd_flops;
  fmt::print(
      "{{\"bench\":\"attention\",\"math\":\"{}\",\"T\":{},\"docs\":{},\"doc_lens\":[{}],\"Hq\":{},"
      "\"Hkv\":{},"
      "\"hd\":{},\"fwd_ms\":{:.4f},\"bwd_ms\":{:.4f},\"fwd_tflops\":{:.3f},\"bwd_tflops\":{:.3f},"
      "\"tflops\":{:.3f}}}\n",
      !std::is_same_v<S, float> ? "bf16" : math == dhp::cuda::AttnMath::tf32 ? "tf32" : "fp32",
      sh.T, sh.docs.size(),
      fmt::join(sh.docs, ","), sh.Hq, sh.Hkv, sh.hd, fwd, bwd, fwd_flops / fwd * 1e-9,
      bwd_flops / bwd * 1e-9, (fwd_flops + bwd_flops) / (fwd + bwd) * 1e-9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time of the CUDA attention kernels on packed causal shapes"};
  int reps = 20, warmup = 3;
  std::string filter, math = "all";
  app.add_option("--reps", reps, "timed calls per shape and pass");
  app.add_option("--warmup", warmup, "untimed calls first");
  app.add_option(
      "--filter", filter,
      "only shapes whose description (e.g. 'T=8192 docs=4 Hq=16 Hkv=8 hd=128') contains this");
  app.add_option("--math", math,
                 "fp32, tf32 (fp32 storage, tensor cores), bf16 (bf16 storage) or all")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "all"}));
  CLI11_PARSE(app, argc, argv);
  const dhp::CudaStatus st = dhp::cuda_status();
  if (st.devices == 0) {
    fmt::print(stderr, "bench_cuda_attention: no CUDA device ({})\n", st.reason);
    return 1;
  }
  fmt::print(stderr, "device: {}\n", st.name);
  try {
    for (int64_t T : {4096, 8192})
      for (int ndocs : {1, 4})
        for (int Hkv : {8, 16})
          for (int hd : {128, 64}) {
            const Shape sh{T, doc_lengths(T, ndocs), 16, Hkv, hd};
            const std::string name =
                fmt::format("T={} docs={} Hq={} Hkv={} hd={}", T, ndocs, sh.Hq, Hkv, hd);
            if (name.find(filter) == std::string::npos) continue;
            if (math == "fp32" || math == "all")
              bench<float>(sh, dhp::cuda::AttnMath::fp32, warmup, reps);
            if (math == "tf32" || math == "all")
              bench<float>(sh, dhp::cuda::AttnMath::tf32, warmup, reps);
            if (math == "bf16" || math == "all")
              bench<dhp::cuda::bf16>(sh, dhp::cuda::AttnMath::tf32, warmup, reps);
          }
  } catch (const dhp::Error& e) {
    fmt::print(stderr, "bench_cuda_attention: {}\n", e.what());
    return 1;
  }
  return 0;
}
