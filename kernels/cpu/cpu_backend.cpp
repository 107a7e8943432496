// The CPU backend: host memory, no stream, and the op interface forwarded to the reference
// kernels of this folder.
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kernels/backend.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_merge.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/patch_merge.h"
#include "kernels/cpu/rope.h"
#include "kernels/check.h"

namespace dhp {
namespace {

class CpuOps final : public Ops {
 public:
  std::string name() const override { return "cpu"; }
  void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t T,
                      int64_t in, int64_t out) const override {
    cpu::linear_forward(y, x, W, b, T, in, out);
  }
  void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                       const float* W, int64_t T, int64_t in, int64_t out,
                       bool accumulate_dx) const override {
    cpu::linear_backward(dx, dW, db, dy, x, W, T, in, out, accumulate_dx);
  }
  void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t T,
                       int64_t C) const override {
    cpu::rmsnorm_forward(y, rstd, x, w, T, C);
  }
  void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                        const float* rstd, int64_t T, int64_t C) const override {
    cpu::rmsnorm_backward(dx, dw, dy, x, w, rstd, T, C);
  }
  void rope_forward(float* x, const int32_t* pos, int64_t T, int H, int hd,
                    double theta) const override {
    cpu::rope_forward(x, pos, T, H, hd, 0, hd, theta);
  }
  void rope_backward(float* dx, const int32_t* pos, int64_t T, int H, int hd,
                     double theta) const override {
    cpu::rope_backward(dx, pos, T, H, hd, 0, hd, theta);
  }
  void rope2d_forward(float* x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                      double theta) const override {
    cpu::rope2d_forward(x, row, col, T, H, hd, theta);
  }
  void rope2d_backward(float* dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                       double theta) const override {
    cpu::rope2d_backward(dx, row, col, T, H, hd, theta);
  }
  void swiglu_forward(float* h, const float* a, const float* b, int64_t n) const override {
    cpu::swiglu_forward(h, a, b, n);
  }
  void swiglu_backward(float* da, float* db, const float* dh, const float* a, const float* b,
                       int64_t n) const override {
    cpu::swiglu_backward(da, db, dh, a, b, n);
  }
  void gelu_forward(float* y, const float* x, int64_t n) const override { cpu::gelu_forward(y, x, n); }
  void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) const override {
    cpu::gelu_backward(dx, dy, x, n);
  }
  void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                         AttnMeta qm, AttnMeta km, const AttnShape& s) const override {
    cpu::attention_forward(out, lse, q, k, v, qm, km, s);
  }
  void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                          const float* lse, const float* q, const float* k, const float* v,
                          AttnMeta qm, AttnMeta km, const AttnShape& s) const override {
    cpu::attention_backward(dq, dk, dv, dout, out, lse, q, k, v, qm, km, s);
  }
  void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse,
                       int64_t T, int H, int hd) const override {
    cpu::attention_merge(out, lse, part_out, part_lse, T, H, hd);
  }
  void cross_entropy_forward(float* lse, CrossEntropyStats* stats, const float* logits,
                             const int32_t* targets, int64_t T, int64_t V) const override {
    const CrossEntropyStats st = cpu::cross_entropy_forward(lse, logits, targets, T, V);
    stats->loss_sum += st.loss_sum;
    stats->count += st.count;
    stats->correct += st.correct;
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                              const int32_t* targets, int64_t T, int64_t V,
                              float scale) const override {
    cpu::cross_entropy_backward(dlogits, logits, lse, targets, T, V, scale);
  }
  void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T,
                         int64_t C) const override {
    cpu::embedding_forward(out, ids, table, T, C);
  }
  void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T,
                          int64_t C) const override {
    cpu::embedding_backward(dtable, dout, ids, T, C);
  }
  void patch_merge_forward(float* out, const float* in, const MergeImage* images, int n_images,
                           int64_t C, int m) const override {
    cpu::patch_merge_forward(out, in, images, n_images, C, m);
  }
  void patch_merge_backward(float* din, const float* dout, const MergeImage* images, int n_images,
                            int64_t C, int m) const override {
    cpu::patch_merge_backward(din, dout, images, n_images, C, m);
  }
  void add_inplace(float* y, const float* x, int64_t n) const override { cpu::add_inplace(y, x, n); }
  void scale_inplace(float* y, float s, int64_t n) const override { cpu::scale_inplace(y, s, n); }
  void fill(float* y, float value, int64_t n) const override { cpu::fill(y, value, n); }
  void sum_squares(double* out, const float* x, int64_t n) const override {
    *out = cpu::sum_squares(x, n);
  }
  void scatter_rows(float* y, const float* src, const int32_t* slot, int64_t T,
                    int64_t C) const override {
    cpu::scatter_rows(y, src, slot, T, C);
  }
  void gather_rows(float* dsrc, const float* dy, const int32_t* slot, int64_t T,
                   int64_t C) const override {
    cpu::gather_rows(dsrc, dy, slot, T, C);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                    const AdamWStep& s) const override {
    cpu::adamw_update(p, g, m, v, n, s);
  }
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool adapt) : configured_(threads), threads_(threads), adapt_(adapt) {
    DHP_CHECK(threads > 0, "the CPU backend needs at least one compute thread (got {})", threads);
    omp_set_num_threads(threads);
    // Parallelism comes from OpenMP tiles around single-threaded BLAS calls (cpu/matmul.cpp).
    cpu::set_blas_threads(1);
  }
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::CPU; }
  const Ops& ops() const override { return ops_; }

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
  int configured_, threads_;
  bool adapt_;
  cpu::LoadMonitor load_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt) {
  return std::make_unique<CpuBackend>(opt.threads, opt.adapt_threads);
}

int default_compute_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

}  // namespace dhp
