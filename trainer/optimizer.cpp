#include "trainer/optimizer.h"

#include <cmath>

#include "kernels/check.h"

namespace dhp {

double learning_rate(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (o.warmup > 0 && step < o.warmup) return o.lr * double(step + 1) / double(o.warmup);
  const int64_t decay_steps = total_steps - o.warmup;
  if (decay_steps <= 1) return o.lr;
  const double progress = std::min(1.0, double(step - o.warmup) / double(decay_steps - 1));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const ParamTable& table, const OptimConfig& cfg, Backend& backend)
    : table_(table),
      cfg_(cfg),
      backend_(backend),
      m_(backend, sizeof(float) * size_t(table.total())),
      v_(backend, sizeof(float) * size_t(table.total())),
      norm_(backend, sizeof(double)) {
  backend_.zero(m_.data(), m_.bytes());
  backend_.zero(v_.data(), v_.bytes());
}

std::vector<float> AdamW::download(const DeviceBuffer& b) const {
  std::vector<float> host(size_t(table_.total()));
  backend_.download(host.data(), b.data(), b.bytes());
  return host;
}

void AdamW::upload_moments(const std::vector<float>& m, const std::vector<float>& v) {
  DHP_ASSERT(int64_t(m.size()) == table_.total() && int64_t(v.size()) == table_.total());
  backend_.upload(m_.data(), m.data(), m_.bytes());
  backend_.upload(v_.data(), v.data(), v_.bytes());
}

double AdamW::grad_norm(const float* grads) const {
  backend_.ops().sum_squares(norm_.as<double>(), grads, table_.total());
  double sq = 0.0;
  backend_.download(&sq, norm_.data(), sizeof(sq));
  return std::sqrt(sq);
}

float AdamW::clip(float* grads, double norm) const {
  if (cfg_.grad_clip <= 0.0 || norm <= cfg_.grad_clip) return 1.0f;
  const float s = float(cfg_.grad_clip / (norm + 1e-6));
  backend_.ops().scale_inplace(grads, s, table_.total());
  return s;
}

void AdamW::update(float* params, const float* grads, double lr) {
  ++t_;
  for (const auto& p : table_.specs()) {
    AdamWStep s{float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                p.decay ? float(cfg_.weight_decay) : 0.0f, t_};
    backend_.ops().adamw_update(params + p.offset, grads + p.offset, m() + p.offset,
                                v() + p.offset, p.numel(), s);
  }
}

}  // namespace dhp
