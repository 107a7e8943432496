#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <vector>

namespace dhp::cpu {

CrossEntropyStats cross_entropy_forward(float* lse, const float* logits, const int32_t* targets,
                                        int64_t T, int64_t V) {
  std::vector<double> loss(T, 0.0);  // (T) per row, summed in order below for determinism
  std::vector<uint8_t> hit(T, 0);    // (T)
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* row = logits + t * V;
    float mx = row[0];
    int64_t arg = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > mx) mx = row[v], arg = v;
    double s = 0.0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(double(row[v] - mx));
    lse[t] = mx + float(std::log(s));
    if (targets[t] >= 0) {
      loss[t] = double(lse[t]) - row[targets[t]];
      hit[t] = arg == targets[t];
    }
  }
  CrossEntropyStats st;
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] < 0) continue;
    st.loss_sum += loss[t];
    st.count += 1;
    st.correct += hit[t];
  }
  return st;
}

void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, int64_t T, int64_t V, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    float* d = dlogits + t * V;
    const float* row = logits + t * V;
    if (targets[t] < 0) {
      for (int64_t v = 0; v < V; ++v) d[v] = 0.0f;
      continue;
    }
    for (int64_t v = 0; v < V; ++v) d[v] = scale * std::exp(row[v] - lse[t]);
    d[targets[t]] -= scale;
  }
}

}  // namespace dhp::cpu
