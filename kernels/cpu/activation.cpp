#include "kernels/cpu/activation.h"

#include <cmath>

namespace dhp::cpu {
namespace {
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
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

void gelu_forward(float* y, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kGeluC * (v + kGeluA * v * v * v)));
  }
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    float u = kGeluC * (v + kGeluA * v * v * v);
    float th = std::tanh(u);
    float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
  }
}

}  // namespace dhp::cpu
