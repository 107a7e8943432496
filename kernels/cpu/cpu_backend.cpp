// The CPU backend: host memory, no stream, and the op interface forwarded to the reference
// kernels of this folder.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "kernels/backend.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_merge.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/channel_scale.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/patch_merge.h"
#include "kernels/cpu/pixels.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/staged_ops.h"
#include "kernels/cpu/vision_embed.h"

namespace dhp {
namespace {

// The fp32 view of an op argument: the reference kernels store everything in fp32 (bf16 storage
// goes through StagedOps, kernels/cpu/staged_ops.h).
template <class V>
auto* f32(ActPtrOf<V> a) {
  DHP_ASSERT(a.is_f32());
  return a.f32();
}

class CpuOps final : public Ops {
 public:
  std::string name() const override { return "cpu"; }
  void linear_forward(Act y, CAct x, CAct W, CAct b, int64_t T, int64_t in,
                      int64_t out) const override {
    cpu::linear_forward(f32(y), f32(x), f32(W), f32(b), T, in, out);
  }
  void linear_backward(Act dx, float* dW, float* db, CAct dy, CAct x, CAct W, int64_t T,
                       int64_t in, int64_t out, bool accumulate_dx) const override {
    cpu::linear_backward(f32(dx), dW, db, f32(dy), f32(x), f32(W), T, in, out, accumulate_dx);
  }
  void rmsnorm_forward(Act y, float* rstd, CAct x, CAct w, int64_t T, int64_t C,
                       float eps) const override {
    cpu::rmsnorm_forward(f32(y), rstd, f32(x), f32(w), T, C, eps);
  }
  void rmsnorm_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, const float* rstd, int64_t T,
                        int64_t C) const override {
    cpu::rmsnorm_backward(f32(dx), dw, f32(dy), f32(x), f32(w), rstd, T, C);
  }
  void rope_forward(Act x, const int32_t* pos, int64_t T, int H, int hd,
                    const RopeSpec& rope) const override {
    cpu::rope_forward(f32(x), pos, T, H, hd, 0, hd, rope);
  }
  void rope_backward(Act dx, const int32_t* pos, int64_t T, int H, int hd,
                     const RopeSpec& rope) const override {
    cpu::rope_backward(f32(dx), pos, T, H, hd, 0, hd, rope);
  }
  void rope2d_forward(Act x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                      const RopeSpec& rope) const override {
    cpu::rope2d_forward(f32(x), row, col, T, H, hd, rope);
  }
  void rope2d_backward(Act dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                       const RopeSpec& rope) const override {
    cpu::rope2d_backward(f32(dx), row, col, T, H, hd, rope);
  }
  void swiglu_forward(Act h, CAct a, CAct b, int64_t n) const override {
    cpu::swiglu_forward(f32(h), f32(a), f32(b), n);
  }
  void swiglu_backward(Act da, Act db, CAct dh, CAct a, CAct b, int64_t n) const override {
    cpu::swiglu_backward(f32(da), f32(db), f32(dh), f32(a), f32(b), n);
  }
  void gelu_forward(Act y, CAct x, int64_t n, GeluKind k) const override {
    cpu::gelu_forward(f32(y), f32(x), n, k);
  }
  void gelu_backward(Act dx, CAct dy, CAct x, int64_t n, GeluKind k) const override {
    cpu::gelu_backward(f32(dx), f32(dy), f32(x), n, k);
  }
  void layernorm_forward(Act y, float* mean, float* rstd, CAct x, CAct w, CAct b, int64_t T,
                         int64_t C, float eps) const override {
    cpu::layernorm_forward(f32(y), mean, rstd, f32(x), f32(w), f32(b), T, C, eps);
  }
  void layernorm_backward(Act dx, float* dw, float* db, CAct dy, CAct x, CAct w,
                          const float* mean, const float* rstd, int64_t T,
                          int64_t C) const override {
    cpu::layernorm_backward(f32(dx), dw, db, f32(dy), f32(x), f32(w), mean, rstd, T, C);
  }  void channel_scale_forward(Act y, CAct x, CAct w, int64_t T, int64_t C) const override {
    cpu::channel_scale_forward(f32(y), f32(x), f32(w), T, C);
  }
  void channel_scale_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, int64_t T,
                              int64_t C) const override {
    cpu::channel_scale_backward(f32(dx), dw, f32(dy), f32(x), f32(w), T, C);
  }

  void vision_embed_forward(Act x, CAct table, CAct cls, const PosImage* images, int n_images,
                            int64_t C, int g0h, int g0w, PosResize resize) const override {
    cpu::vision_embed_forward(f32(x), f32(table), f32(cls), images, n_images, C, g0h, g0w, resize);
  }
  void vision_embed_backward(float* dtable, float* dcls, CAct dx, const PosImage* images,
                             int n_images, int64_t C, int g0h, int g0w, PosResize resize) const override {
    cpu::vision_embed_backward(dtable, dcls, f32(dx), images, n_images, C, g0h, g0w, resize);
  }
  void attention_forward(Act out, float* lse, CAct q, CAct k, CAct v, AttnMeta qm, AttnMeta km,
                         const AttnShape& s) const override {
    cpu::attention_forward(f32(out), lse, f32(q), f32(k), f32(v), qm, km, s);
  }
  void attention_backward(Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q,
                          CAct k, CAct v, AttnMeta qm, AttnMeta km,
                          const AttnShape& s) const override {
    cpu::attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(out), lse, f32(q), f32(k),
                            f32(v), qm, km, s);
  }
  void attention_merge(float* out, float* lse, CAct part_out, const float* part_lse, int64_t T,
                       int H, int hd) const override {
    cpu::attention_merge(out, lse, f32(part_out), part_lse, T, H, hd);
  }
  void cross_entropy_forward(float* lse, CrossEntropyStats* stats, CAct logits,
                             const int32_t* targets, int64_t T, int64_t V) const override {
    const CrossEntropyStats st = cpu::cross_entropy_forward(lse, f32(logits), targets, T, V);
    stats->loss_sum += st.loss_sum;
    stats->count += st.count;
    stats->correct += st.correct;
  }
  void cross_entropy_backward(Act dlogits, CAct logits, const float* lse, const int32_t* targets,
                              int64_t T, int64_t V, float scale) const override {
    cpu::cross_entropy_backward(f32(dlogits), f32(logits), lse, targets, T, V, scale);
  }
  void embedding_forward(Act out, const int32_t* ids, CAct table, int64_t T,
                         int64_t C) const override {
    cpu::embedding_forward(f32(out), ids, f32(table), T, C);
  }
  void embedding_backward(float* dtable, CAct dout, const int32_t* ids, int64_t T,
                          int64_t C) const override {
    cpu::embedding_backward(dtable, f32(dout), ids, T, C);
  }
  void normalize_pixels(Act out, const uint8_t* pixels, int64_t n,
                        const PixelNorm& norm) const override {
    cpu::normalize_pixels(f32(out), pixels, n, norm);
  }
  void patch_merge_forward(Act out, CAct in, const MergeImage* images, int n_images, int64_t C,
                           int m) const override {
    cpu::patch_merge_forward(f32(out), f32(in), images, n_images, C, m);
  }
  void patch_merge_backward(Act din, CAct dout, const MergeImage* images, int n_images, int64_t C,
                            int m) const override {
    cpu::patch_merge_backward(f32(din), f32(dout), images, n_images, C, m);
  }
  void add_inplace(Act y, CAct x, int64_t n) const override { cpu::add_inplace(f32(y), f32(x), n); }
  void accumulate(float* acc, CAct x, int64_t n) const override {
    cpu::add_inplace(acc, f32(x), n);
  }
  void scale_inplace(float* y, float s, int64_t n) const override { cpu::scale_inplace(y, s, n); }
  void fill(Act y, float value, int64_t n) const override { cpu::fill(f32(y), value, n); }
  void cast(Act y, const float* x, int64_t n) const override {
    if (f32(y) != x && n > 0) std::memcpy(f32(y), x, sizeof(float) * size_t(n));
  }
  void sum_squares(double* out, const float* x, int64_t n) const override {
    *out = cpu::sum_squares(x, n);
  }
  void scatter_rows(Act y, CAct src, const int32_t* slot, int64_t T, int64_t C) const override {
    cpu::scatter_rows(f32(y), f32(src), slot, T, C);
  }
  void gather_rows(Act dsrc, CAct dy, const int32_t* slot, int64_t T, int64_t C) const override {
    cpu::gather_rows(f32(dsrc), f32(dy), slot, T, C);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                    const AdamWStep& s) const override {
    cpu::adamw_update(p, g, m, v, n, s);
  }
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool adapt, Precision precision)
      : configured_(threads), threads_(threads), adapt_(adapt) {
    // bf16 stores activations and the working weights in bf16; the products stay fp32 here.
    if (precision == Precision::bf16) staged_ = make_bf16_staged_ops(ops_);
    DHP_CHECK(threads > 0, "the CPU backend needs at least one compute thread (got {})", threads);
    omp_set_num_threads(threads);
    // Parallelism comes from OpenMP tiles around single-threaded BLAS calls (cpu/matmul.cpp).
    cpu::set_blas_threads(1);
  }
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }
  const Ops& ops() const override {
    if (staged_) return *staged_;
    return ops_;
  }

  void* allocate(size_t bytes) override {
    ++allocations_;
    // 64-byte alignment: cache lines, and what Carver aligns slices to.
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    DHP_CHECK(p, "out of host memory allocating {:.1f} MiB", double(bytes) / (1 << 20));
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
  void upload(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void synchronize() override {}

  void adapt_to_load() override {
    if (!adapt_) return;
    const int want = load_.threads_for(configured_);
    if (want != threads_) {
      threads_ = want;
      omp_set_num_threads(want);
    }
  }
  int threads() const override { return threads_; }

 private:
  CpuOps ops_;
  std::unique_ptr<Ops> staged_;  // bf16 storage
  int configured_, threads_;
  bool adapt_;
  cpu::LoadMonitor load_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt) {
  return std::make_unique<CpuBackend>(opt.threads, opt.adapt_threads, opt.precision);
}

int default_compute_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

}  // namespace dhp
