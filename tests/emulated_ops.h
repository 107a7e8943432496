// The CUDA backend's ops other than the GEMMs and attention, with their kernel bodies
// (kernels/cuda/*_kernels.cuh) run by the thread emulator on host memory: each op launches the
// bodies as its launcher in kernels/cuda/<family>.cu does, on the same grid and block (the same
// launch-shape functions) and with the same choice of vector path, so the op table
// (tests/ops_table) checks the kernels without a GPU. Include it after tests/cuda_emulator_ext.h
// and the kernel bodies.
#pragma once

#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/ops.h"

namespace dhp::testing {

// Runs body on the launcher's grid and block.
inline void run(const cuda::LaunchDims& l, size_t smem_floats,
                const std::function<void(float*)>& body) {
  emu::launch_dims({l.grid_x, l.grid_y, 1}, {l.block_x, l.block_y, 1}, smem_floats, body);
}

template <class T>
T& shared_as(float* smem) {
  return *reinterpret_cast<T*>(smem);
}

// rope_rotate as the launcher runs it (rope2d is two of them).
template <class S>
void rope_run(S* x, const int32_t* pos, int64_t T, int H, int hd, int offset, int span,
              const RopeSpec& rope, float sign) {
  const int64_t n = T * (span / 2);
  if (n <= 0) return;
  run(cuda::rope::launch(n), 0,
      [&](float*) { cuda::rope::rotate_block(x, pos, T, H, hd, offset, span, rope, sign); });
}

class EmulatedOps : public Ops {
 public:
  explicit EmulatedOps(DType t) : t_(t) {}
  std::string name() const override { return "emulated cuda"; }
  DType dtype() const override { return t_; }

  void linear_forward(Act, CAct, CAct, CAct, int64_t, int64_t, int64_t) const override {
    unsupported("linear_forward");
  }
  // The bias gradient alone: the GEMMs are cuBLASLt's, not ours to emulate.
  void linear_backward(Act dx, float* dW, float* db, CAct dy, CAct, CAct, int64_t T, int64_t,
                       int64_t out, bool) const override {
    if (dx || dW) unsupported("linear_backward's GEMMs");
    if (!db || out <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::ew::columns_launch(out), emu::floats_for<cuda::ew::ColumnShared>(), [&](float* sm) {
        cuda::ew::column_sum_block(db, as<S>(dy), T, out, shared_as<cuda::ew::ColumnShared>(sm));
      });
    });
  }
  void rmsnorm_forward(Act y, float* rstd, CAct x, CAct w, int64_t T, int64_t C,
                       float eps) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::norm::rows_launch(T, C), cuda::norm::kRowSharedFloats, [&](float* sm) {
        cuda::norm::forward_block(as<S>(y), rstd, as<S>(x), as<S>(w), T, C, eps, sm);
      });
    });
  }
  void rmsnorm_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, const float* rstd, int64_t T,
                        int64_t C) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      if (dw) {
        const cuda::LaunchDims l = cuda::norm::dw_launch(T, C);
        // NaN, as stale device scratch would be garbage: a slice that is not written shows.
        std::vector<float> partial(size_t(l.grid_y > 1 ? cuda::kNormDwPartialFloats : 0),
                                   std::numeric_limits<float>::quiet_NaN());
        run(l, emu::floats_for<cuda::norm::DwShared>(), [&](float* sm) {
          cuda::norm::dw_block(dw, partial.data(), as<S>(dy), as<S>(x), rstd, T, C,
                               shared_as<cuda::norm::DwShared>(sm));
        });
        if (l.grid_y > 1)
          run(cuda::norm::dw_finish_launch(C), 0,
              [&](float*) { cuda::norm::dw_finish(dw, partial.data(), int(l.grid_y), C); });
      }
      run(cuda::norm::rows_launch(T, C), cuda::norm::kRowSharedFloats, [&](float* sm) {
        cuda::norm::dx_block(as<S>(dx), as<S>(dy), as<S>(x), as<S>(w), rstd, T, C, sm);
      });
    });
  }
  void rope_forward(Act x, const int32_t* pos, int64_t T, int H, int hd,
                    const RopeSpec& rope) const override {
    with([&](auto s) { rope_run(as<decltype(s)>(x), pos, T, H, hd, 0, hd, rope, 1.0f); });
  }
  void rope_backward(Act dx, const int32_t* pos, int64_t T, int H, int hd,
                     const RopeSpec& rope) const override {
    with([&](auto s) { rope_run(as<decltype(s)>(dx), pos, T, H, hd, 0, hd, rope, -1.0f); });
  }
  void rope2d_forward(Act x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                      const RopeSpec& rope) const override {
    rope2d(x, row, col, T, H, hd, rope, 1.0f);
  }
  void rope2d_backward(Act dx, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
                       const RopeSpec& rope) const override {
    rope2d(dx, row, col, T, H, hd, rope, -1.0f);
  }
  void swiglu_forward(Act h, CAct a, CAct b, int64_t n) const override {
    pointwise(cuda::act::launch(n), n, [&](auto s) {
      using S = decltype(s);
      cuda::act::swiglu_forward_block(as<S>(h), as<S>(a), as<S>(b), n);
    });
  }
  void swiglu_backward(Act da, Act db, CAct dh, CAct a, CAct b, int64_t n) const override {
    pointwise(cuda::act::launch(n), n, [&](auto s) {
      using S = decltype(s);
      cuda::act::swiglu_backward_block(as<S>(da), as<S>(db), as<S>(dh), as<S>(a), as<S>(b), n);
    });
  }
  void gelu_forward(Act y, CAct x, int64_t n, GeluKind k) const override {
    pointwise(cuda::act::launch(n), n, [&](auto s) {
      using S = decltype(s);
      cuda::act::gelu_forward_block(as<S>(y), as<S>(x), n, k);
    });
  }
  void gelu_backward(Act dx, CAct dy, CAct x, int64_t n, GeluKind k) const override {
    pointwise(cuda::act::launch(n), n, [&](auto s) {
      using S = decltype(s);
      cuda::act::gelu_backward_block(as<S>(dx), as<S>(dy), as<S>(x), n, k);
    });
  }
  void layernorm_forward(Act y, float* mean, float* rstd, CAct x, CAct w, CAct b, int64_t T,
                         int64_t C, float eps) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::layernorm::rows_launch(T), cuda::layernorm::kRowSharedFloats, [&](float* sm) {
        cuda::layernorm::forward_block(as<S>(y), mean, rstd, as<S>(x), as<S>(w), as<S>(b), C,
                                       eps, sm);
      });
    });
  }
  void layernorm_backward(Act dx, float* dw, float* db, CAct dy, CAct x, CAct w,
                          const float* mean, const float* rstd, int64_t T,
                          int64_t C) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      if (dw || db)
        run(cuda::layernorm::params_launch(C), emu::floats_for<cuda::layernorm::ParamShared>(),
            [&](float* sm) {
              cuda::layernorm::params_block(dw, db, as<S>(dy), as<S>(x), mean, rstd, T, C,
                                            shared_as<cuda::layernorm::ParamShared>(sm));
            });
      run(cuda::layernorm::rows_launch(T), cuda::layernorm::kRowSharedFloats, [&](float* sm) {
        cuda::layernorm::dx_block(as<S>(dx), as<S>(dy), as<S>(x), as<S>(w), mean, rstd, C, sm);
      });
    });
  }  void channel_scale_forward(Act y, CAct x, CAct w, int64_t T, int64_t C) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::channel_scale::elements_launch(T * C), 0, [&](float*) {
        cuda::channel_scale::scale_block(as<S>(y), as<S>(x), as<S>(w), T * C, C);
      });
    });
  }
  void channel_scale_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, int64_t T,
                              int64_t C) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      if (dw)
        run(cuda::channel_scale::params_launch(C), emu::floats_for<cuda::channel_scale::ParamShared>(),
            [&](float* sm) {
              cuda::channel_scale::params_block(dw, as<S>(dy), as<S>(x), T, C,
                                                shared_as<cuda::channel_scale::ParamShared>(sm));
            });
      run(cuda::channel_scale::elements_launch(T * C), 0, [&](float*) {
        cuda::channel_scale::scale_block(as<S>(dx), as<S>(dy), as<S>(w), T * C, C);
      });
    });
  }

  void vision_embed_forward(Act x, CAct table, CAct cls, const PosImage* images, int n_images,
                            int64_t C, int g0h, int g0w, PosResize resize) const override {
    if (n_images <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::vembed::forward_launch(C, n_images), 0, [&](float*) {
        cuda::vembed::forward_block(as<S>(x), as<S>(table), as<S>(cls), images, n_images, C, g0h,
                                    g0w, resize);
      });
    });
  }
  void vision_embed_backward(float* dtable, float* dcls, CAct dx, const PosImage* images,
                             int n_images, int64_t C, int g0h, int g0w, PosResize resize) const override {
    if (n_images <= 0 || (!dtable && !dcls)) return;
    const int64_t rows = dtable ? (dcls ? 1 : 0) + int64_t(g0h) * g0w : 1;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::vembed::backward_launch(C, rows), 0, [&](float*) {
        cuda::vembed::backward_block(dtable, dcls, as<S>(dx), images, n_images, C, g0h, g0w, resize);
      });
    });
  }
  void attention_forward(Act, float*, CAct, CAct, CAct, AttnMeta, AttnMeta,
                         const AttnShape&) const override {
    unsupported("attention_forward (test_cuda_attention_emulated)");
  }
  void attention_backward(Act, Act, Act, CAct, CAct, const float*, CAct, CAct, CAct, AttnMeta,
                          AttnMeta, const AttnShape&) const override {
    unsupported("attention_backward (test_cuda_attention_emulated)");
  }
  void attention_merge(float*, float*, CAct, const float*, int64_t, int, int) const override {
    unsupported("attention_merge (test_cuda_attention_emulated)");
  }
  // The launcher's chunks of kCrossEntropyRows rows, each through the rows scratch.
  void cross_entropy_forward(float* lse, CrossEntropyStats* stats, CAct logits,
                             const int32_t* targets, int64_t T, int64_t V) const override {
    std::vector<cuda::CrossEntropyRow> rows(size_t(cuda::kCrossEntropyRows),
                                            cuda::CrossEntropyRow{7.0, 7, 7});
    with([&](auto s) {
      using S = decltype(s);
      for (int64_t t0 = 0; t0 < T; t0 += cuda::kCrossEntropyRows) {
        const int64_t n = std::min(T - t0, cuda::kCrossEntropyRows);
        run(cuda::xent::rows_launch(n), emu::floats_for<cuda::xent::Online[cuda::kWarp]>(),
            [&](float* sm) {
              cuda::xent::forward_block(lse + t0, rows.data(), as<S>(logits) + t0 * V,
                                        targets + t0, V, &shared_as<cuda::xent::Online>(sm));
            });
        run(cuda::xent::stats_launch(), emu::floats_for<double[cuda::kWarp]>(), [&](float* sm) {
          cuda::xent::stats_block(stats, rows.data(), n, &shared_as<double>(sm));
        });
      }
    });
  }
  void cross_entropy_backward(Act dlogits, CAct logits, const float* lse, const int32_t* targets,
                              int64_t T, int64_t V, float scale) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      const bool vec4 = cuda::xent::backward_vec4(as<S>(dlogits), as<S>(logits), V);
      run(cuda::xent::rows_launch(T), 0, [&](float*) {
        cuda::xent::backward_block(as<S>(dlogits), as<S>(logits), lse, targets, V, scale, vec4);
      });
    });
  }
  void embedding_forward(Act out, const int32_t* ids, CAct table, int64_t T,
                         int64_t C) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::embed::rows_launch(T), 0,
          [&](float*) { cuda::embed::forward_block(as<S>(out), ids, as<S>(table), C); });
    });
  }
  void embedding_backward(float* dtable, CAct dout, const int32_t* ids, int64_t T,
                          int64_t C) const override {
    if (T <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::embed::rows_launch(T), emu::floats_for<cuda::embed::BackwardShared>(),
          [&](float* sm) {
            cuda::embed::backward_block(dtable, as<S>(dout), ids, T, C,
                                        shared_as<cuda::embed::BackwardShared>(sm));
          });
    });
  }
  void normalize_pixels(Act out, const uint8_t* pixels, int64_t n,
                        const PixelNorm& norm) const override {
    if (n <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::pixels::launch(n), 0,
          [&](float*) { cuda::pixels::normalize_block(as<S>(out), pixels, n, norm); });
    });
  }
  void patch_merge_forward(Act out, CAct in, const MergeImage* images, int n_images, int64_t C,
                           int m) const override {
    merge<true>(out, in, images, n_images, C, m);
  }
  void patch_merge_backward(Act din, CAct dout, const MergeImage* images, int n_images,
                            int64_t C, int m) const override {
    merge<false>(din, dout, images, n_images, C, m);
  }
  void add_inplace(Act y, CAct x, int64_t n) const override {
    if (n <= 0) return;
    if (y.t == DType::F32 && cuda::ew::add_vec4(y.f32(), x.f32(), n)) {
      run(cuda::ew::launch(n / 4), 0, [&](float*) {
        cuda::ew::add4_block(static_cast<float4*>(y.p), static_cast<const float4*>(x.p), n / 4);
      });
      return;
    }
    pointwise(cuda::ew::launch(n), n, [&](auto s) {
      using S = decltype(s);
      cuda::ew::add_block(as<S>(y), as<S>(x), n);
    });
  }
  void accumulate(float* acc, CAct x, int64_t n) const override {
    pointwise(cuda::ew::launch(n), n, [&](auto s) { cuda::ew::accumulate_block(acc, as<decltype(s)>(x), n); });
  }
  void scale_inplace(float* y, float s, int64_t n) const override {
    if (n > 0) run(cuda::ew::launch(n), 0, [&](float*) { cuda::ew::scale_block(y, s, n); });
  }
  // Also fills fp32 buffers under bf16 storage, as the CUDA backend does.
  void fill(Act y, float value, int64_t n) const override {
    if (n <= 0) return;
    run(cuda::ew::launch(n), 0, [&](float*) {
      if (y.t == DType::BF16)
        cuda::ew::fill_block(static_cast<cuda::bf16*>(y.p), value, n);
      else
        cuda::ew::fill_block(y.f32(), value, n);
    });
  }
  // fp32 storage is a copy on the device (cudaMemcpyAsync).
  void cast(Act y, const float* x, int64_t n) const override {
    if (n <= 0) return;
    if (y.t == DType::F32) {
      if (y.p != x) std::copy(x, x + n, y.f32());
      return;
    }
    run(cuda::ew::launch(n), 0,
        [&](float*) { cuda::ew::cast_block(static_cast<cuda::bf16*>(y.p), x, n); });
  }
  void sum_squares(double* out, const float* x, int64_t n) const override {
    std::vector<double> partial(cuda::kSumSquaresBlocks, 7.0);
    run(cuda::ew::sum_squares_launch(), emu::floats_for<double[cuda::kWarp]>(), [&](float* s) {
      cuda::ew::sum_squares_partial_block(partial.data(), x, n, &shared_as<double>(s));
    });
    run(cuda::ew::partials_launch(), emu::floats_for<double[cuda::kWarp]>(), [&](float* s) {
      cuda::ew::sum_partials_block(out, partial.data(), cuda::kSumSquaresBlocks,
                                   &shared_as<double>(s));
    });
  }
  void scatter_rows(Act y, CAct src, const int32_t* slot, int64_t T, int64_t C) const override {
    copy_rows(y, src, slot, T, C, true);
  }
  void gather_rows(Act dsrc, CAct dy, const int32_t* slot, int64_t T, int64_t C) const override {
    copy_rows(dsrc, dy, slot, T, C, false);
  }
  // Whole 16-byte vectors, then the scalar rest, as the launcher splits it.
  void adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                    const AdamWStep& s) const override {
    if (n <= 0) return;
    const cuda::adamw::Args a = cuda::adamw::args_of(s);
    const int64_t done = cuda::adamw::vector_part(p, g, m, v, n);
    if (done > 0)
      run(cuda::adamw::launch(done / 4), 0, [&](float*) {
        cuda::adamw::update4_block(reinterpret_cast<float4*>(p), reinterpret_cast<const float4*>(g),
                                   reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v),
                                   done / 4, a);
      });
    if (done < n)
      run(cuda::adamw::launch(n - done), 0, [&](float*) {
        cuda::adamw::update_block(p + done, g + done, m + done, v + done, n - done, a);
      });
  }

 private:
  [[noreturn]] static void unsupported(const std::string& what) {
    throw std::logic_error("not emulated: " + what);
  }
  template <class F>
  void with(F&& f) const {
    if (t_ == DType::BF16)
      f(cuda::bf16{});
    else
      f(float{});
  }
  // The typed pointer of an op argument in storage S.
  template <class S, class V>
  static auto* as(ActPtrOf<V> a) {
    using P = std::conditional_t<std::is_const_v<V>, const S, S>;
    return static_cast<P*>(a.p);
  }
  // One grid-stride kernel over n elements on the family's launch, in the storage.
  template <class F>
  void pointwise(const cuda::LaunchDims& l, int64_t n, F&& body) const {
    if (n <= 0) return;
    with([&](auto s) { run(l, 0, [&](float*) { body(s); }); });
  }
  void rope2d(Act x, const int32_t* row, const int32_t* col, int64_t T, int H, int hd,
              const RopeSpec& rope, float sign) const {
    with([&](auto s) {
      using S = decltype(s);
      rope_run(as<S>(x), row, T, H, hd, 0, hd / 2, rope, sign);
      rope_run(as<S>(x), col, T, H, hd, hd / 2, hd / 2, rope, sign);
    });
  }
  template <bool Forward>
  void merge(Act dst, CAct src, const MergeImage* images, int n_images, int64_t C, int m) const {
    if (n_images <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::merge::launch(n_images), 0, [&](float*) {
        cuda::merge::merge_block<Forward>(as<S>(dst), as<S>(src), images, C, m);
      });
    });
  }
  void copy_rows(Act dst, CAct src, const int32_t* slot, int64_t T, int64_t C,
                 bool scatter) const {
    if (T <= 0 || C <= 0) return;
    with([&](auto s) {
      using S = decltype(s);
      run(cuda::ew::rows_launch(T), 0, [&](float*) {
        cuda::ew::copy_rows_block(as<S>(dst), as<S>(src), slot, C, scatter);
      });
    });
  }

  DType t_;
};

}  // namespace dhp::testing
