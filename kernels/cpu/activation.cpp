#include "kernels/cpu/activation.h"

#include <cmath>

namespace dhp::cpu {
namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr float kSqrtHalf = 0.7071067811865476f;    // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.3989422804014327f;  // 1 / sqrt(2·pi)
constexpr float kQuickA = 1.702f;                   // CLIP's quick_gelu
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void swiglu_forward(float* h, const float* a, const float* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) h[i] = a[i] * sigmoid(a[i]) * b[i];
}

void swiglu_backward(float* da, float* db, const float* dh, const float* a, const float* b,
                     int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float s = sigmoid(a[i]);
    float silu = a[i] * s;
    // Read everything before writing: da may alias dh.
    float g = dh[i], bi = b[i];
    db[i] = g * silu;
    da[i] = g * bi * (s + silu * (1.0f - s));
  }
}

void gelu_forward(float* y, const float* x, int64_t n, GeluKind k) {
  switch (k) {
    case GeluKind::Tanh:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + std::tanh(kGeluC * (v + kGeluA * v * v * v)));
      }
      return;
    case GeluKind::Erf:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + std::erf(v * kSqrtHalf));
      }
      return;
    case GeluKind::Quick:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid(kQuickA * x[i]);
      return;
  }
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n, GeluKind k) {
  switch (k) {
    case GeluKind::Tanh:
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        float u = kGeluC * (v + kGeluA * v * v * v);
        float th = std::tanh(u);
        float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
        dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
      }
      return;
    case GeluKind::Erf:
      // d/dx = Phi(x) + x·phi(x), Phi the normal CDF and phi its density.
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + std::erf(v * kSqrtHalf));
        float pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
      }
      return;
    case GeluKind::Quick:
      // d/dx = s + 1.702·x·s·(1 - s), s = sigmoid(1.702·x).
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        float v = x[i];
        float s = sigmoid(kQuickA * v);
        dx[i] = dy[i] * (s + kQuickA * v * s * (1.0f - s));
      }
      return;
  }
}

}  // namespace dhp::cpu
