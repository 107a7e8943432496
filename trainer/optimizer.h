// AdamW with decoupled weight decay (flagged per parameter in the parameter table), global-norm
// gradient clipping and the warm-up + cosine learning-rate schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/params.h"
#include "trainer/config.h"

namespace dhp {

// Linear warm-up from lr/warmup to lr over `warmup` steps, then cosine decay to min_lr at the
// last step. `step` counts from 0.
double learning_rate(const OptimConfig& o, int64_t step, int64_t total_steps);

class AdamW {
 public:
  AdamW(const ParamTable& table, const OptimConfig& cfg, Backend& backend);

  // Global L2 norm of the gradient arena (synchronises with the device to read it).
  double grad_norm(const float* grads) const;
  // Scales gradients so their norm is at most cfg.grad_clip (when set); returns the scale.
  float clip(float* grads, double norm) const;
  // One update of every parameter with learning rate lr; increments the step count.
  void update(float* params, const float* grads, double lr);

  int64_t steps_taken() const { return t_; }
  // The moments on the host (checkpoints) and back; each synchronises with the device.
  std::vector<float> download_m() const { return download(m_); }
  std::vector<float> download_v() const { return download(v_); }
  void upload_moments(const std::vector<float>& m, const std::vector<float>& v);
  float* m() { return m_.as<float>(); }  // first moments, same layout as the parameters
  float* v() { return v_.as<float>(); }  // second moments
  const float* m() const { return m_.as<float>(); }
  const float* v() const { return v_.as<float>(); }
  void set_steps_taken(int64_t t) { t_ = t; }

 private:
  std::vector<float> download(const DeviceBuffer& b) const;
  const ParamTable& table_;
  OptimConfig cfg_;
  Backend& backend_;
  DeviceBuffer m_, v_;  // (n_params)
  DeviceBuffer norm_;   // (1) double: the squared norm, read by grad_norm
  int64_t t_ = 0;
};

}  // namespace dhp
