// The op interface the model is written against. Pointers are device pointers of the backend
// that implements it (kernels/backend.h); shapes and conventions are those of the CPU
// reference in kernels/cpu/ (one header per op family, forward and backward side by side).
// An op never allocates and never returns a value to the host: results land in device
// buffers that the caller reads when it chooses to synchronise.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/op_types.h"

namespace dhp {

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string name() const = 0;

  virtual void linear_forward(float* y, const float* x, const float* W, const float* b, int64_t T,
                              int64_t in, int64_t out) const = 0;
  virtual void linear_backward(float* dx, float* dW, float* db, const float* dy, const float* x,
                               const float* W, int64_t T, int64_t in, int64_t out,
                               bool accumulate_dx) const = 0;
  virtual void rmsnorm_forward(float* y, float* rstd, const float* x, const float* w, int64_t T,
                               int64_t C) const = 0;
  virtual void rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x,
                                const float* w, const float* rstd, int64_t T, int64_t C) const = 0;
  virtual void rope_forward(float* x, const int32_t* pos, int64_t T, int H, int hd,
                            double theta) const = 0;
  virtual void rope_backward(float* dx, const int32_t* pos, int64_t T, int H, int hd,
                             double theta) const = 0;
  virtual void rope2d_forward(float* x, const int32_t* row, const int32_t* col, int64_t T, int H,
                              int hd, double theta) const = 0;
  virtual void rope2d_backward(float* dx, const int32_t* row, const int32_t* col, int64_t T, int H,
                               int hd, double theta) const = 0;
  virtual void swiglu_forward(float* h, const float* a, const float* b, int64_t n) const = 0;
  virtual void swiglu_backward(float* da, float* db, const float* dh, const float* a,
                               const float* b, int64_t n) const = 0;
  virtual void gelu_forward(float* y, const float* x, int64_t n) const = 0;
  virtual void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) const = 0;
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, AttnMeta qm, AttnMeta km,
                                 const AttnShape& s) const = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v, AttnMeta qm, AttnMeta km,
                                  const AttnShape& s) const = 0;
  // Adds the rows' statistics to *stats (a device buffer).
  virtual void cross_entropy_forward(float* lse, CrossEntropyStats* stats, const float* logits,
                                     const int32_t* targets, int64_t T, int64_t V) const = 0;
  // Merges a partial attention result over other keys into (out, lse): see
  // kernels/cpu/attention_merge.h. out (T, H·hd), lse (H, T).
  virtual void attention_merge(float* out, float* lse, const float* part_out,
                               const float* part_lse, int64_t T, int H, int hd) const = 0;
  virtual void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                                      const int32_t* targets, int64_t T, int64_t V,
                                      float scale) const = 0;
  virtual void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T,
                                 int64_t C) const = 0;
  virtual void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T,
                                  int64_t C) const = 0;
  virtual void patch_merge_forward(float* out, const float* in, const MergeImage* images,
                                   int n_images, int64_t C, int m) const = 0;
  virtual void patch_merge_backward(float* din, const float* dout, const MergeImage* images,
                                    int n_images, int64_t C, int m) const = 0;
  virtual void add_inplace(float* y, const float* x, int64_t n) const = 0;
  virtual void scale_inplace(float* y, float s, int64_t n) const = 0;
  virtual void fill(float* y, float value, int64_t n) const = 0;
  // *out (a device double) = sum of x², in an order independent of the thread count.
  virtual void sum_squares(double* out, const float* x, int64_t n) const = 0;
  // y[t] = src[slot[t]] where slot[t] >= 0; and its inverse, dsrc[slot[t]] = dy[t] (written).
  virtual void scatter_rows(float* y, const float* src, const int32_t* slot, int64_t T,
                            int64_t C) const = 0;
  virtual void gather_rows(float* dsrc, const float* dy, const int32_t* slot, int64_t T,
                           int64_t C) const = 0;
  virtual void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                            const AdamWStep& s) const = 0;
};

}  // namespace dhp
