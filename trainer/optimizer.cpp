#include "trainer/optimizer.h"

#include <cmath>

namespace dhp {

double learning_rate(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (o.warmup > 0 && step < o.warmup) return o.lr * double(step + 1) / double(o.warmup);
  const int64_t decay_steps = total_steps - o.warmup;
  if (decay_steps <= 1) return o.lr;
  const double progress = std::min(1.0, double(step - o.warmup) / double(decay_steps - 1));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const ParamTable& table, const OptimConfig& cfg, const Ops& ops)
    : table_(table),
      cfg_(cfg),
      ops_(ops),
      m_(Tensor::zeros({table.total()})),
      v_(Tensor::zeros({table.total()})) {}

double AdamW::grad_norm(const float* grads) const {
  return std::sqrt(ops_.sum_squares(grads, table_.total()));
}

float AdamW::clip(float* grads, double norm) const {
  if (cfg_.grad_clip <= 0.0 || norm <= cfg_.grad_clip) return 1.0f;
  const float s = float(cfg_.grad_clip / (norm + 1e-6));
  ops_.scale_inplace(grads, s, table_.total());
  return s;
}

void AdamW::update(float* params, const float* grads, double lr) {
  ++t_;
  for (const auto& p : table_.specs()) {
    AdamWStep s{float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                p.decay ? float(cfg_.weight_decay) : 0.0f, t_};
    ops_.adamw_update(params + p.offset, grads + p.offset, m_.f32() + p.offset,
                      v_.f32() + p.offset, p.numel(), s);
  }
}

}  // namespace dhp
