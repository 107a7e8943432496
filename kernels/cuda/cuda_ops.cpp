#include "kernels/cuda/cuda_ops.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/check.h"

namespace dhp {
namespace {
// cuBLASLt's recommended workspace on Hopper; enough for every algorithm of our shapes.
constexpr size_t kGemmWorkspace = size_t(32) << 20;

template <class S>
constexpr DType dtype_of() {
  return std::is_same_v<S, float> ? DType::F32 : DType::BF16;
}

// The typed device pointer of an op argument in storage S.
template <class S, class V>
auto* as(ActPtrOf<V> a) {
  DHP_ASSERT(!a || a.t == dtype_of<S>());
  using P = std::conditional_t<std::is_const_v<V>, const S, S>;
  return static_cast<P*>(a.p);
}

// The grids live on the device and are the batch's (checked where it is built); the
// pretrained grid is the config's.
void check_position_grid(int64_t C, int g0h, int g0w) {
  DHP_CHECK(g0h > 0 && g0w > 0, "vision_embed: the pretrained position grid is {}x{}", g0h, g0w);
  DHP_CHECK(C > 0, "vision_embed: {} channels", C);
}

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

// cuDNN's side of the attention choice, where it can run and can be asked for.
std::unique_ptr<cuda::CudnnAttention> make_cudnn(Backend& backend, cudaStream_t stream,
                                                 Precision precision, AttentionImpl mode) {
  if (mode == AttentionImpl::own) return nullptr;
  std::string why = cuda::cudnn_unavailable();
  if (why.empty() && precision != Precision::bf16)
    why = fmt::format("train.precision = \"{}\" (cuDNN's fused attention stores bf16)", precision_name(precision));
  DHP_CHECK(why.empty() || mode != AttentionImpl::cudnn, "train.attention = \"cudnn\": {}", why);
  if (!why.empty()) {
    spdlog::info("attention: dhp's own kernel ({})", why);
    return nullptr;
  }
  return std::make_unique<cuda::CudnnAttention>(backend, stream);
}

}  // namespace

CudaOps::CudaOps(Backend& backend, cudaStream_t stream, Precision precision, AttentionImpl attention)
    : backend_(backend),
      stream_(stream),
      dtype_(storage_dtype(precision)),
      attn_math_(precision == Precision::fp32 ? cuda::AttnMath::fp32 : cuda::AttnMath::tf32),
      workspace_(backend, kGemmWorkspace),
      ce_rows_(backend, sizeof(cuda::CrossEntropyRow) * cuda::kCrossEntropyRows),
      sum_partial_(backend, sizeof(double) * cuda::kSumSquaresBlocks),
      norm_partial_(backend, sizeof(float) * cuda::kNormDwPartialFloats),
      gemm_(std::make_unique<cuda::Gemm>(stream, precision, workspace_.data(), kGemmWorkspace)),
      attn_(std::make_unique<cuda::AttentionSelect>(
          attention, make_cudnn(backend, stream, precision, attention), stream)) {}

CudaOps::~CudaOps() = default;

namespace {
size_t round_256(size_t n) { return (n + 255) & ~size_t(255); }
}  // namespace

cuda::AttentionSelect::Verify CudaOps::verify(std::vector<std::pair<CAct, int64_t>> outputs) const {
  auto save = [this, outputs] {
    size_t bytes = 0;
    for (const auto& [x, n] : outputs) bytes += round_256(dtype_size(x.t) * size_t(n));
    if (verify_saved_.bytes() < bytes) verify_saved_ = DeviceBuffer(backend_, bytes);
    char* at = verify_saved_.as<char>();
    for (const auto& [x, n] : outputs) {
      backend_.copy(at, x.p, dtype_size(x.t) * size_t(n));
      at += round_256(dtype_size(x.t) * size_t(n));
    }
  };
  // sqrt(|own - library|² / |own|²) over all outputs, in fp32 on the device.
  auto distance = [this, outputs] {
    double diff = 0, norm = 0;
    const char* at = verify_saved_.as<char>();
    for (const auto& [x, n] : outputs) {
      const size_t need = round_256(sizeof(float) * size_t(n)) + 2 * sizeof(double);
      if (verify_diff_.bytes() < need) verify_diff_ = DeviceBuffer(backend_, need);
      float* d = verify_diff_.as<float>();
      double* sums = reinterpret_cast<double*>(verify_diff_.as<char>() + round_256(sizeof(float) * size_t(n)));
      const CAct saved(at, x.t);
      with_storage([&](auto s_) {
        using S = decltype(s_);
        cuda::fill<float>(stream_, d, 0.0f, n);
        cuda::accumulate(stream_, d, as<S>(saved), n);
        cuda::scale_inplace(stream_, d, -1.0f, n);
        cuda::accumulate(stream_, d, as<S>(x), n);
        cuda::sum_squares(stream_, sums, sum_partial_.as<double>(), d, n);
        cuda::fill<float>(stream_, d, 0.0f, n);
        cuda::accumulate(stream_, d, as<S>(x), n);
        cuda::sum_squares(stream_, sums + 1, sum_partial_.as<double>(), d, n);
      });
      double h[2];
      backend_.download(h, sums, sizeof h);
      diff += h[0], norm += h[1];
      at += round_256(dtype_size(x.t) * size_t(n));
    }
    return norm > 0 ? std::sqrt(diff / norm) : diff > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  };
  return {save, distance};
}

std::vector<AttnTiming> CudaOps::take_attention_timings() const { return attn_->take_timings(); }

void CudaOps::agree_attention(const std::vector<AttnTiming>& everyone) const { attn_->agree(everyone); }

template <class F>
void CudaOps::with_storage(F&& f) const {
  if (dtype_ == DType::BF16)
    f(cuda::bf16{});
  else
    f(float{});
}

void CudaOps::linear_forward(Act y, CAct x, CAct W, CAct b, int64_t T, int64_t in,
                             int64_t out) const {
  DHP_ASSERT(y.t == dtype_ && x.t == dtype_ && W.t == dtype_ && (!b || b.t == dtype_));
  gemm_->linear_forward(y.p, x.p, W.p, b.p, T, in, out, cuda_type(dtype_));
}

void CudaOps::linear_backward(Act dx, float* dW, float* db, CAct dy, CAct x, CAct W, int64_t T,
                              int64_t in, int64_t out, bool accumulate_dx) const {
  DHP_ASSERT((!dx || dx.t == dtype_) && dy.t == dtype_ && x.t == dtype_ && W.t == dtype_);
  gemm_->linear_backward(dx.p, dW, dy.p, x.p, W.p, T, in, out, accumulate_dx, cuda_type(dtype_));
  // db accumulates (+=), which cuBLASLt's BGRADB epilogue (it writes) cannot do without a
  // second buffer; a deterministic column sum costs one read of dy.
  if (db)
    with_storage([&](auto s) {
      using S = decltype(s);
      cuda::column_sum_add(stream_, db, as<S>(dy), T, out);
    });
}

// The ops below pass every activation argument through as<S>, which checks its dtype.
#define DHP_STORAGE_CALL(...)    \
  with_storage([&](auto s_) {    \
    using S = decltype(s_);      \
    __VA_ARGS__;                 \
  })

void CudaOps::rmsnorm_forward(Act y, float* rstd, CAct x, CAct w, int64_t T, int64_t C,
                              float eps) const {
  DHP_STORAGE_CALL(cuda::rmsnorm_forward(stream_, as<S>(y), rstd, as<S>(x), as<S>(w), T, C, eps));
}

void CudaOps::rmsnorm_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, const float* rstd,
                               int64_t T, int64_t C) const {
  DHP_STORAGE_CALL(cuda::rmsnorm_backward(stream_, as<S>(dx), dw, norm_partial_.as<float>(),
                                          as<S>(dy), as<S>(x), as<S>(w), rstd, T, C));
}

void CudaOps::rope_forward(Act x, const int32_t* pos, int64_t T, int H, int hd,
                           const RopeSpec& rope) const {
  DHP_STORAGE_CALL(cuda::rope_forward(stream_, as<S>(x), pos, T, H, hd, rope));
}

void CudaOps::rope_backward(Act dx, const int32_t* pos, int64_t T, int H, int hd,
                            const RopeSpec& rope) const {
  DHP_STORAGE_CALL(cuda::rope_backward(stream_, as<S>(dx), pos, T, H, hd, rope));
}

void CudaOps::rope2d_forward(Act x, const int32_t* row, const int32_t* col, int64_t T, int H,
                             int hd, const RopeSpec& rope) const {
  DHP_STORAGE_CALL(cuda::rope2d_forward(stream_, as<S>(x), row, col, T, H, hd, rope));
}

void CudaOps::rope2d_backward(Act dx, const int32_t* row, const int32_t* col, int64_t T, int H,
                              int hd, const RopeSpec& rope) const {
  DHP_STORAGE_CALL(cuda::rope2d_backward(stream_, as<S>(dx), row, col, T, H, hd, rope));
}

void CudaOps::swiglu_forward(Act h, CAct a, CAct b, int64_t n) const {
  DHP_STORAGE_CALL(cuda::swiglu_forward(stream_, as<S>(h), as<S>(a), as<S>(b), n));
}

void CudaOps::swiglu_backward(Act da, Act db, CAct dh, CAct a, CAct b, int64_t n) const {
  DHP_STORAGE_CALL(
      cuda::swiglu_backward(stream_, as<S>(da), as<S>(db), as<S>(dh), as<S>(a), as<S>(b), n));
}

void CudaOps::gelu_forward(Act y, CAct x, int64_t n, GeluKind k) const {
  DHP_STORAGE_CALL(cuda::gelu_forward(stream_, as<S>(y), as<S>(x), n, k));
}

void CudaOps::gelu_backward(Act dx, CAct dy, CAct x, int64_t n, GeluKind k) const {
  DHP_STORAGE_CALL(cuda::gelu_backward(stream_, as<S>(dx), as<S>(dy), as<S>(x), n, k));
}

void CudaOps::layernorm_forward(Act y, float* mean, float* rstd, CAct x, CAct w, CAct b,
                                int64_t T, int64_t C, float eps) const {
  DHP_STORAGE_CALL(cuda::layernorm_forward(stream_, as<S>(y), mean, rstd, as<S>(x), as<S>(w),
                                           as<S>(b), T, C, eps));
}

void CudaOps::layernorm_backward(Act dx, float* dw, float* db, CAct dy, CAct x, CAct w,
                                 const float* mean, const float* rstd, int64_t T,
                                 int64_t C) const {
  DHP_STORAGE_CALL(cuda::layernorm_backward(stream_, as<S>(dx), dw, db, as<S>(dy), as<S>(x),
                                            as<S>(w), mean, rstd, T, C));
}

void CudaOps::channel_scale_forward(Act y, CAct x, CAct w, int64_t T, int64_t C) const {
  DHP_STORAGE_CALL(cuda::channel_scale_forward(stream_, as<S>(y), as<S>(x), as<S>(w), T, C));
}

void CudaOps::channel_scale_backward(Act dx, float* dw, CAct dy, CAct x, CAct w, int64_t T,
                                     int64_t C) const {
  DHP_STORAGE_CALL(cuda::channel_scale_backward(stream_, as<S>(dx), dw, as<S>(dy), as<S>(x), as<S>(w), T, C));
}

void CudaOps::vision_embed_forward(Act x, CAct table, CAct cls, const PosImage* images,
                                   int n_images, int64_t C, int g0h, int g0w, PosResize resize) const {
  check_position_grid(C, g0h, g0w);
  DHP_STORAGE_CALL(cuda::vision_embed_forward(stream_, as<S>(x), as<S>(table), as<S>(cls),
                                              images, n_images, C, g0h, g0w, resize));
}

void CudaOps::vision_embed_backward(float* dtable, float* dcls, CAct dx, const PosImage* images,
                                    int n_images, int64_t C, int g0h, int g0w, PosResize resize) const {
  check_position_grid(C, g0h, g0w);
  DHP_STORAGE_CALL(cuda::vision_embed_backward(stream_, dtable, dcls, as<S>(dx), images,
                                               n_images, C, g0h, g0w, resize));
}

void CudaOps::attention_forward(Act out, float* lse, CAct q, CAct k, CAct v, AttnMeta qm,
                                AttnMeta km, const AttnShape& s) const {
  attn_->run(
      cuda::sdpa::Pass::forward, dtype_, qm, km, s,
      [&] {
        DHP_STORAGE_CALL(cuda::attention_forward(stream_, as<S>(out), lse, as<S>(q), as<S>(k),
                                                 as<S>(v), qm, km, s, attn_math_));
      },
      [&] { return attn_->library()->forward(out, lse, q, k, v, qm, km, s); },
      verify({{out, s.Tq * s.Hq * s.hd}}));
}

void CudaOps::attention_backward(Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse,
                                 CAct q, CAct k, CAct v, AttnMeta qm, AttnMeta km,
                                 const AttnShape& s) const {
  attn_->run(
      cuda::sdpa::Pass::backward, dtype_, qm, km, s,
      [&] {
        DHP_STORAGE_CALL(cuda::attention_backward(stream_, as<S>(dq), as<S>(dk), as<S>(dv),
                                                  as<S>(dout), as<S>(out), lse, as<S>(q),
                                                  as<S>(k), as<S>(v), qm, km, s, attn_math_));
      },
      [&] {
        return attn_->library()->backward(dq, dk, dv, dout, out, lse, q, k, v, qm, km, s);
      },
      verify({{dq, s.Tq * s.Hq * s.hd}, {dk, s.Tk * s.Hkv * s.hd}, {dv, s.Tk * s.Hkv * s.hd}}));
}

void CudaOps::attention_merge(float* out, float* lse, CAct part_out, const float* part_lse,
                              int64_t T, int H, int hd) const {
  DHP_STORAGE_CALL(
      cuda::attention_merge(stream_, out, lse, as<S>(part_out), part_lse, T, H, hd));
}

void CudaOps::cross_entropy_forward(float* lse, CrossEntropyStats* stats, CAct logits,
                                    const int32_t* targets, int64_t T, int64_t V) const {
  DHP_STORAGE_CALL(cuda::cross_entropy_forward(stream_, lse, stats,
                                               ce_rows_.as<cuda::CrossEntropyRow>(),
                                               as<S>(logits), targets, T, V));
}

void CudaOps::cross_entropy_backward(Act dlogits, CAct logits, const float* lse,
                                     const int32_t* targets, int64_t T, int64_t V,
                                     float scale) const {
  DHP_STORAGE_CALL(cuda::cross_entropy_backward(stream_, as<S>(dlogits), as<S>(logits), lse,
                                                targets, T, V, scale));
}

void CudaOps::embedding_forward(Act out, const int32_t* ids, CAct table, int64_t T,
                                int64_t C) const {
  DHP_STORAGE_CALL(cuda::embedding_forward(stream_, as<S>(out), ids, as<S>(table), T, C));
}

void CudaOps::embedding_backward(float* dtable, CAct dout, const int32_t* ids, int64_t T,
                                 int64_t C) const {
  DHP_STORAGE_CALL(cuda::embedding_backward(stream_, dtable, as<S>(dout), ids, T, C));
}

void CudaOps::normalize_pixels(Act out, const uint8_t* pixels, int64_t n,
                               const PixelNorm& norm) const {
  DHP_STORAGE_CALL(cuda::normalize_pixels(stream_, as<S>(out), pixels, n, norm));
}

void CudaOps::patch_merge_forward(Act out, CAct in, const MergeImage* images, int n_images,
                                  int64_t C, int m) const {
  DHP_STORAGE_CALL(
      cuda::patch_merge_forward(stream_, as<S>(out), as<S>(in), images, n_images, C, m));
}

void CudaOps::patch_merge_backward(Act din, CAct dout, const MergeImage* images, int n_images,
                                   int64_t C, int m) const {
  DHP_STORAGE_CALL(
      cuda::patch_merge_backward(stream_, as<S>(din), as<S>(dout), images, n_images, C, m));
}

void CudaOps::add_inplace(Act y, CAct x, int64_t n) const {
  DHP_STORAGE_CALL(cuda::add_inplace(stream_, as<S>(y), as<S>(x), n));
}

void CudaOps::accumulate(float* acc, CAct x, int64_t n) const {
  DHP_STORAGE_CALL(cuda::accumulate(stream_, acc, as<S>(x), n));
}

void CudaOps::scale_inplace(float* y, float s, int64_t n) const {
  cuda::scale_inplace(stream_, y, s, n);
}

void CudaOps::fill(Act y, float value, int64_t n) const {
  // Also fills fp32 buffers under bf16 storage (a plain float pointer converts to an fp32 Act).
  if (y.t == DType::BF16)
    cuda::fill(stream_, as<cuda::bf16>(y), value, n);
  else
    cuda::fill(stream_, as<float>(y), value, n);
}

void CudaOps::cast(Act y, const float* x, int64_t n) const {
  if (y.t == DType::BF16) {
    cuda::cast(stream_, as<cuda::bf16>(y), x, n);
  } else if (y.p != x && n > 0) {
    DHP_CUDA_CHECK(cudaMemcpyAsync(y.p, x, sizeof(float) * size_t(n), cudaMemcpyDeviceToDevice,
                                   stream_));
  }
}

void CudaOps::sum_squares(double* out, const float* x, int64_t n) const {
  cuda::sum_squares(stream_, out, sum_partial_.as<double>(), x, n);
}

void CudaOps::scatter_rows(Act y, CAct src, const int32_t* slot, int64_t T, int64_t C) const {
  DHP_STORAGE_CALL(cuda::scatter_rows(stream_, as<S>(y), as<S>(src), slot, T, C));
}

void CudaOps::gather_rows(Act dsrc, CAct dy, const int32_t* slot, int64_t T, int64_t C) const {
  DHP_STORAGE_CALL(cuda::gather_rows(stream_, as<S>(dsrc), as<S>(dy), slot, T, C));
}

#undef DHP_STORAGE_CALL

void CudaOps::adamw_update(float* p, const float* g, float* m, float* v, int64_t n,
                           const AdamWStep& s) const {
  cuda::adamw_update(stream_, p, g, m, v, n, s);
}

}  // namespace dhp
