#include "kernels/cpu/staged_ops.h"

#include <algorithm>
#include <vector>

#include "core/bf16.h"
#include "core/check.h"

namespace dhp {
namespace {

// An input of an op as fp32: the bf16 values widened into a buffer of its own.
class In {
 public:
  In(CAct a, int64_t n) {
    if (!a) return;
    DHP_ASSERT(a.t == DType::BF16);
    buf_.resize(size_t(n));
    widen_bf16(buf_.data(), static_cast<const uint16_t*>(a.p), n);
  }
  operator CAct() const { return buf_.empty() ? CAct() : CAct(buf_.data()); }

 private:
  std::vector<float> buf_;
};

// An output as fp32, rounded back into the bf16 buffer when the op is done. `read`: the op
// reads it too (it updates in place or accumulates, or leaves some elements as they were).
class Out {
 public:
  Out(Act a, int64_t n, bool read) : dst_(a), n_(n) {
    if (!a) return;
    DHP_ASSERT(a.t == DType::BF16);
    buf_.resize(size_t(n));
    if (read) widen_bf16(buf_.data(), static_cast<const uint16_t*>(a.p), n);
  }
  ~Out() {
    if (dst_) round_to_bf16(static_cast<uint16_t*>(dst_.p), buf_.data(), n_);
  }
  Out(const Out&) = delete;
  Out& operator=(const Out&) = delete;
  operator Act() { return dst_ && !buf_.empty() ? Act(buf_.data()) : Act(); }

 private:
  Act dst_;
  int64_t n_;
  std::vector<float> buf_;
};

int64_t merge_patches(const MergeImage* images, int n_images) {
  int64_t P = 0;
  for (int i = 0; i < n_images; ++i) P += int64_t(images[i].grid_h) * images[i].grid_w;
  return P;
}

// The rows of an encoder stream the images of vision_embed reach.
int64_t stream_rows(const PosImage* images, int n_images, int64_t cls_rows) {
  int64_t rows = 0;
  for (int i = 0; i < n_images; ++i)
    rows = std::max(rows, images[i].row + cls_rows + int64_t(images[i].grid_h) * images[i].grid_w);
  return rows;
}

class StagedOps final : public Ops {
 public:
  explicit StagedOps(const Ops& fp32) : f_(fp32) {}
  std::string name() const override { return f_.name() + "-bf16"; }
  DType dtype() const override { return DType::BF16; }

  void linear_forward(Act y, CAct x, CAct W, CAct b, int64_t T, int64_t in,
                      int64_t out) const override {
    Out sy(y, T * out, false);
    f_.linear_forward(sy, In(x, T * in), In(W, out * in), In(b, out), T, in, out);
  }
  void linear_backward(Act dx, float* dW, float* db, CAct dy, CAct x, CAct W, int64_t T,
                       int64_t in, int64_t out, bool accumulate_dx) const override {
    // W is read only for dx and x only for dW, as in the reference: only those are widened.
    Out sdx(dx, T * in, accumulate_dx);
    const In sx(dW ? x : CAct(), T * in), sW(dx ? W : CAct(), out * in);
    f_.linear_backward(sdx, dW, db, In(dy, T * out), sx, sW, T, in, out, accumulate_dx);
  }
  void rmsnorm_forward(Act y, float* rstd, CAct x, CAct w, int64_t T, int64_t C,
                       float eps) const override {
    Out sy(y, T * C, false);
    f_.rmsnorm_forward(sy, rstd, In(x, T * C), In(w, C), T, C, eps);
  }
  void rmsnorm_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, const float* rstd, int64_t T,
                        int64_t C) const override {
    Out sdx(dx, T * C, false);
    f_.rmsnorm_backward(sdx, dw, In(dy, T * C), In(x, T * C), In(w, C), rstd, T, C);
  }
  void rope_forward(Act x, const int32_t* pos, int64_t T, int H, int hd,
                    const RopeSpec& rope) const override {
    Out sx(x, T * H * hd, true);
    f_.rope_forward(sx, pos, T, H, hd, rope);
  }
  void rope_backward(Act dx, const int32_t* pos, int64_t T, int H, int hd,
                     const RopeSpec& rope) const override {
    Out sx(dx, T * H * hd, true);
    f_.rope_backward(sx, pos, T, H, hd, rope);
  }
  void rope2d_forward(Act x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                      const RopeSpec& rope) const override {
    Out sx(x, T * H * hd, true);
    f_.rope2d_forward(sx, row, col, T, H, hd, rope);
  }
  void rope2d_backward(Act dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                       const RopeSpec& rope) const override {
    Out sx(dx, T * H * hd, true);
    f_.rope2d_backward(sx, row, col, T, H, hd, rope);
  }
  void swiglu_forward(Act h, CAct a, CAct b, int64_t n) const override {
    Out sh(h, n, false);
    f_.swiglu_forward(sh, In(a, n), In(b, n), n);
  }
  void swiglu_backward(Act da, Act db, CAct dh, CAct a, CAct b, int64_t n) const override {
    Out sda(da, n, false), sdb(db, n, false);
    f_.swiglu_backward(sda, sdb, In(dh, n), In(a, n), In(b, n), n);
  }
  void gelu_forward(Act y, CAct x, int64_t n, GeluKind k) const override {
    Out sy(y, n, false);
    f_.gelu_forward(sy, In(x, n), n, k);
  }
  void gelu_backward(Act dx, CAct dy, CAct x, int64_t n, GeluKind k) const override {
    Out sdx(dx, n, false);
    f_.gelu_backward(sdx, In(dy, n), In(x, n), n, k);
  }
  void layernorm_forward(Act y, float* mean, float* rstd, CAct x, CAct w, CAct b, int64_t T,
                         int64_t C, float eps) const override {
    Out sy(y, T * C, false);
    f_.layernorm_forward(sy, mean, rstd, In(x, T * C), In(w, C), In(b, C), T, C, eps);
  }
  void layernorm_backward(Act dx, float* dw, float* db, CAct dy, CAct x, CAct w,
                          const float* mean, const float* rstd, int64_t T,
                          int64_t C) const override {
    Out sdx(dx, T * C, false);
    f_.layernorm_backward(sdx, dw, db, In(dy, T * C), In(x, T * C), In(w, C), mean, rstd, T, C);
  }
  void channel_scale_forward(Act y, CAct x, CAct w, int64_t T, int64_t C) const override {
    Out sy(y, T * C, false);
    f_.channel_scale_forward(sy, In(x, T * C), In(w, C), T, C);
  }
  void channel_scale_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, int64_t T,
                              int64_t C) const override {
    Out sdx(dx, T * C, false);
    f_.channel_scale_backward(sdx, dw, In(dy, T * C), In(x, T * C), In(w, C), T, C);
  }
  // The stream's rows up to the last image's are staged: rows the op does not touch round-trip
  // exactly (a bf16 value is an fp32 value).
  void vision_embed_forward(Act x, CAct table, CAct cls, const PosImage* images, int n_images,
                            int64_t C, int g0h, int g0w, PosResize resize) const override {
    const int64_t off = cls ? 1 : 0;
    Out sx(x, stream_rows(images, n_images, off) * C, true);
    f_.vision_embed_forward(sx, In(table, (off + int64_t(g0h) * g0w) * C), In(cls, C), images,
                            n_images, C, g0h, g0w, resize);
  }
  void vision_embed_backward(float* dtable, float* dcls, CAct dx, const PosImage* images,
                             int n_images, int64_t C, int g0h, int g0w, PosResize resize) const override {
    if (!dtable && !dcls) return;
    const int64_t off = dcls ? 1 : 0;
    f_.vision_embed_backward(dtable, dcls, In(dx, stream_rows(images, n_images, off) * C), images,
                             n_images, C, g0h, g0w, resize);
  }
  void attention_forward(Act out, float* lse, CAct q, CAct k, CAct v, AttnMeta qm, AttnMeta km,
                         const AttnShape& s) const override {
    const int64_t nq = s.Tq * s.Hq * s.hd, nk = s.Tk * s.Hkv * s.hd;
    Out so(out, nq, false);
    f_.attention_forward(so, lse, In(q, nq), In(k, nk), In(v, nk), qm, km, s);
  }
  void attention_backward(Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q,
                          CAct k, CAct v, AttnMeta qm, AttnMeta km,
                          const AttnShape& s) const override {
    const int64_t nq = s.Tq * s.Hq * s.hd, nk = s.Tk * s.Hkv * s.hd;
    Out sdq(dq, nq, false), sdk(dk, nk, false), sdv(dv, nk, false);
    f_.attention_backward(sdq, sdk, sdv, In(dout, nq), In(out, nq), lse, In(q, nq), In(k, nk),
                          In(v, nk), qm, km, s);
  }
  void attention_merge(float* out, float* lse, CAct part_out, const float* part_lse, int64_t T,
                       int H, int hd) const override {
    f_.attention_merge(out, lse, In(part_out, T * H * hd), part_lse, T, H, hd);
  }
  void cross_entropy_forward(float* lse, CrossEntropyStats* stats, CAct logits,
                             const int32_t* targets, int64_t T, int64_t V) const override {
    f_.cross_entropy_forward(lse, stats, In(logits, T * V), targets, T, V);
  }
  void cross_entropy_backward(Act dlogits, CAct logits, const float* lse, const int32_t* targets,
                              int64_t T, int64_t V, float scale) const override {
    const In sl(logits, T * V);  // read before dlogits, which may be the same buffer, is written
    Out sd(dlogits, T * V, false);
    f_.cross_entropy_backward(sd, sl, lse, targets, T, V, scale);
  }
  // The table is read by row, so only the rows the ids name are widened: a copy of bf16 rows.
  void embedding_forward(Act out, const int32_t* ids, CAct table, int64_t T,
                         int64_t C) const override {
    DHP_ASSERT(out.t == DType::BF16 && table.t == DType::BF16);
    auto* o = static_cast<uint16_t*>(out.p);
    const auto* tb = static_cast<const uint16_t*>(table.p);
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) o[t * C + c] = ids[t] < 0 ? 0 : tb[int64_t(ids[t]) * C + c];
  }
  void embedding_backward(float* dtable, CAct dout, const int32_t* ids, int64_t T,
                          int64_t C) const override {
    f_.embedding_backward(dtable, In(dout, T * C), ids, T, C);
  }
  void normalize_pixels(Act out, const uint8_t* pixels, int64_t n,
                        const PixelNorm& norm) const override {
    Out so(out, n, false);
    f_.normalize_pixels(so, pixels, n, norm);
  }
  void patch_merge_forward(Act out, CAct in, const MergeImage* images, int n_images, int64_t C,
                           int m) const override {
    const int64_t n = merge_patches(images, n_images) * C;
    Out so(out, n, false);
    f_.patch_merge_forward(so, In(in, n), images, n_images, C, m);
  }
  void patch_merge_backward(Act din, CAct dout, const MergeImage* images, int n_images, int64_t C,
                            int m) const override {
    const int64_t n = merge_patches(images, n_images) * C;
    Out sdin(din, n, false);
    f_.patch_merge_backward(sdin, In(dout, n), images, n_images, C, m);
  }
  void add_inplace(Act y, CAct x, int64_t n) const override {
    Out sy(y, n, true);
    f_.add_inplace(sy, In(x, n), n);
  }
  void accumulate(float* acc, CAct x, int64_t n) const override {
    f_.accumulate(acc, In(x, n), n);
  }
  void scale_inplace(float* y, float s, int64_t n) const override { f_.scale_inplace(y, s, n); }
  void fill(Act y, float value, int64_t n) const override {
    if (y.is_f32()) return f_.fill(y, value, n);  // fp32 buffers (accumulators) too
    const uint16_t h = bf16_from_float(value);
    auto* o = static_cast<uint16_t*>(y.p);
    for (int64_t i = 0; i < n; ++i) o[i] = h;
  }
  void cast(Act y, const float* x, int64_t n) const override {
    if (y.is_f32()) return f_.cast(y, x, n);
    round_to_bf16(static_cast<uint16_t*>(y.p), x, n);
  }
  void sum_squares(double* out, const float* x, int64_t n) const override {
    f_.sum_squares(out, x, n);
  }
  // Row copies move bf16 rows as they are.
  void scatter_rows(Act y, CAct src, const int32_t* slot, int64_t T, int64_t C) const override {
    copy_rows(y, src, slot, T, C, true);
  }
  void gather_rows(Act dsrc, CAct dy, const int32_t* slot, int64_t T, int64_t C) const override {
    copy_rows(dsrc, dy, slot, T, C, false);
  }
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                    const AdamWStep& s) const override {
    f_.adamw_update(p, g, m, v, n, s);
  }

 private:
  static void copy_rows(Act dst, CAct src, const int32_t* slot, int64_t T, int64_t C,
                        bool scatter) {
    DHP_ASSERT(dst.t == DType::BF16 && src.t == DType::BF16);
    auto* d = static_cast<uint16_t*>(dst.p);
    const auto* x = static_cast<const uint16_t*>(src.p);
    for (int64_t t = 0; t < T; ++t) {
      if (slot[t] < 0) continue;
      const int64_t to = scatter ? t : slot[t], from = scatter ? slot[t] : t;
      std::memcpy(d + to * C, x + from * C, sizeof(uint16_t) * size_t(C));
    }
  }

  const Ops& f_;
};

}  // namespace

std::unique_ptr<Ops> make_bf16_staged_ops(const Ops& fp32) {
  return std::make_unique<StagedOps>(fp32);
}

}  // namespace dhp
