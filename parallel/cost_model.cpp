#include "parallel/cost_model.h"

#include <algorithm>
#include <cmath>

#include "kernels/check.h"

namespace dhp {

DeviceProfile device_profile(const std::string& name) {
  DeviceProfile p;
  p.name = name;
  CostCoeffs& c = p.coeffs;
  if (name == "cpu") {
    // Placeholders of the order of an OpenBLAS core pair and shared-memory MPI; a measured
    // profiling pass replaces them through refit().
    c = CostCoeffs{1.0 / 20e9, 1.0 / 5e9, 1.0 / 5e9, 1.0 / 1e9, 20e-6, 100e-6};
    p.act_bytes = 4, p.weight_bytes = 4, p.grad_bytes = 4, p.optim_bytes = 8;
    p.workspace_bytes = int64_t(256) << 20, p.logits_chunk = 1024;
    return p;
  }
  // GPUs: bf16 compute and gradients, fp32 master weights and Adam moments (ZeRO-1 shards). Rates are
  // dense bf16 peak times a typical model FLOPs utilisation (~50% GEMM, ~40% attention);
  // NVLink ring send/recv at ~200 GB/s per direction, InfiniBand at ~25 GB/s per GPU.
  double peak = 0, mfu = 0.5;
  if (name == "a100") peak = 312e12;
  else if (name == "h100") peak = 989e12;
  else if (name == "h200") peak = 989e12, mfu = 0.55;  // same SMs, more HBM bandwidth
  DHP_CHECK(peak > 0, "unknown device profile '{}' (parallel.device): use one of cpu, a100, h100, h200",
            name);
  c.sec_per_flop = 1.0 / (peak * mfu);
  c.sec_per_att_flop = 1.0 / (peak * (mfu - 0.1));
  c.sec_per_byte_intra = 1.0 / (name == "a100" ? 150e9 : 200e9);
  c.sec_per_byte_inter = 1.0 / 25e9;
  c.sec_per_step = 15e-6;
  c.sec_per_seq = 1e-3;
  p.act_bytes = 2, p.weight_bytes = 2, p.grad_bytes = 2, p.optim_bytes = 12;
  p.workspace_bytes = int64_t(3) << 30, p.logits_chunk = 4096;
  return p;
}

std::vector<std::string> device_profile_names() { return {"cpu", "a100", "h100", "h200"}; }

ModelConfig model_profile(const std::string& name) {
  ModelConfig m;
  if (name == "tiny") return m;
  DHP_CHECK(name == "7b", "unknown model profile '{}': use tiny or 7b", name);
  m.dim = 3584, m.layers = 28, m.heads = 28, m.kv_heads = 4, m.head_dim = 128;
  m.ffn = 18944, m.vocab_size = 152064, m.rope_theta = 1e6;
  m.vision.patch = 14, m.vision.dim = 1280, m.vision.layers = 32, m.vision.heads = 16;
  m.vision.ffn = 3420, m.vision.merge = 2;
  m.vision.min_pixels = 56 * 56, m.vision.max_pixels = 28 * 28 * 4096;
  return m;
}

CostModel::CostModel(const ModelConfig& m, const DeviceProfile& dev, int ranks_per_node, bool recompute)
    : model_(m), device_(dev), coeffs_(dev.coeffs), ranks_per_node_(std::max(1, ranks_per_node)),
      recompute_(recompute) {
  const double d = m.dim, q = m.q_dim(), kv = m.kv_dim(), L = m.layers;
  const auto& v = m.vision;
  const double dv = v.dim, m2 = double(v.merge) * v.merge;
  // A GEMM costs 2 FLOPs per multiply-add forward and twice that backward; recompute adds a
  // second forward.
  const double passes = recompute ? 4.0 : 3.0;
  dec_flops_per_token_ = passes * 2.0 * (L * (d * q + 2 * d * kv + q * d + 3 * d * m.ffn) + d * m.vocab_size);
  vis_flops_per_patch_ = passes * 2.0 * (v.layers * (4 * dv * dv + 3 * dv * v.ffn) + double(v.patch_numel()) * dv);
  proj_flops_per_token_ = passes * 2.0 * (m2 * dv * d + d * d);
  // Flash-style attention: 2 matmuls forward, 5 backward (scores recomputed), 2 more under
  // recompute; each 2·heads·head_dim FLOPs per kept pair.
  const double att_mm = recompute ? 9.0 : 7.0;
  dec_att_per_pair_ = att_mm * 2.0 * q;
  vis_att_per_pair_ = att_mm * 2.0 * dv;
  // The ring moves K and V forward and K, V, dK, dV backward (and K, V again on recompute).
  const double ring_blocks = recompute ? 8.0 : 6.0;
  dec_bytes_per_token_ = ring_blocks * kv * dev.act_bytes;
  vis_bytes_per_patch_ = ring_blocks * dv * dev.act_bytes;
  ring_passes_ = recompute ? 3 : 2;
}

double CostModel::decoder_pairs(const SeqShape& s) {
  const double L = double(s.tokens());
  return L * (L + 1) / 2;
}

double CostModel::vision_pairs(const SeqShape& s) const {
  if (s.vision_tokens <= 0) return 0;
  const int64_t m2 = int64_t(model_.vision.merge) * model_.vision.merge;
  const int64_t n = std::max<int32_t>(1, s.images);
  const int64_t q = s.vision_tokens / n, r = s.vision_tokens % n;
  const double big = double(m2 * (q + 1)), small = double(m2 * q);
  return double(r) * big * big + double(n - r) * small * small;
}

SeqCost CostModel::prepare(const SeqShape& s) const {
  SeqCost c;
  const double m2 = double(model_.vision.merge) * model_.vision.merge;
  const double patches = m2 * double(s.vision_tokens);
  c.linear_flops = dec_flops_per_token_ * double(s.tokens()) + vis_flops_per_patch_ * patches +
                   proj_flops_per_token_ * double(s.vision_tokens);
  c.att_flops[0] = dec_att_per_pair_ * decoder_pairs(s);
  c.ring_bytes[0] = dec_bytes_per_token_ * double(s.tokens());
  c.layers[0] = model_.layers;
  if (s.vision_tokens > 0 && model_.vision.layers > 0) {
    c.att_flops[1] = vis_att_per_pair_ * vision_pairs(s);
    c.ring_bytes[1] = vis_bytes_per_patch_ * patches;
    c.layers[1] = model_.vision.layers;
  }
  return c;
}

std::vector<double> CostModel::features(const SeqCost& c, int d) const {
  const double dd = d;
  std::vector<double> f(6, 0.0);
  f[0] = c.linear_flops / dd;
  f[1] = (c.att_flops[0] * c.layers[0] + c.att_flops[1] * c.layers[1]) / dd;
  f[5] = 1.0;
  if (d <= 1) return f;
  const bool inter = d > ranks_per_node_;
  const double byte_rate = inter ? coeffs_.sec_per_byte_inter : coeffs_.sec_per_byte_intra;
  for (int x = 0; x < 2; ++x) {
    if (c.layers[x] == 0) continue;
    const double step_compute = coeffs_.sec_per_att_flop * c.att_flops[x] / (dd * dd);
    const double step_xfer = ring_passes_ * coeffs_.sec_per_step + byte_rate * c.ring_bytes[x] / dd;
    if (step_xfer <= step_compute) continue;
    // An exposed step costs the transfer instead of the compute it hides.
    const double steps = double(c.layers[x]) * (dd - 1);
    f[1] -= steps * c.att_flops[x] / (dd * dd);
    f[inter ? 3 : 2] += steps * c.ring_bytes[x] / dd;
    f[4] += steps * ring_passes_;
  }
  return f;
}

double CostModel::seconds(const SeqCost& c, int d) const {
  const double dd = d;
  double t = (coeffs_.sec_per_flop * c.linear_flops +
              coeffs_.sec_per_att_flop * (c.att_flops[0] * c.layers[0] + c.att_flops[1] * c.layers[1])) / dd +
             coeffs_.sec_per_seq;
  if (d <= 1) return t;
  const double byte_rate = d > ranks_per_node_ ? coeffs_.sec_per_byte_inter : coeffs_.sec_per_byte_intra;
  for (int x = 0; x < 2; ++x) {
    if (c.layers[x] == 0) continue;
    const double exposed = ring_passes_ * coeffs_.sec_per_step + byte_rate * c.ring_bytes[x] / dd -
                           coeffs_.sec_per_att_flop * c.att_flops[x] / (dd * dd);
    if (exposed > 0) t += double(c.layers[x]) * (dd - 1) * exposed;
  }
  return t;
}

int64_t CostModel::ticks(const SeqCost& c, int d) const {
  return std::max<int64_t>(1, std::llround(seconds(c, d) * 1e9));
}

namespace {

// Solves the n x n system a·x = b in place by Gaussian elimination with partial pivoting.
std::vector<double> solve_linear(std::vector<double> a, std::vector<double> b, int n) {
  for (int col = 0; col < n; ++col) {
    int piv = col;
    for (int r = col + 1; r < n; ++r)
      if (std::fabs(a[r * n + col]) > std::fabs(a[piv * n + col])) piv = r;
    for (int j = 0; j < n; ++j) std::swap(a[col * n + j], a[piv * n + j]);
    std::swap(b[col], b[piv]);
    const double p = a[col * n + col];
    DHP_ASSERT(p != 0);
    for (int r = 0; r < n; ++r) {
      if (r == col) continue;
      const double f = a[r * n + col] / p;
      for (int j = col; j < n; ++j) a[r * n + j] -= f * a[col * n + j];
      b[r] -= f * b[col];
    }
  }
  for (int i = 0; i < n; ++i) b[i] /= a[i * n + i];
  return b;
}

double& coeff(CostCoeffs& c, int i) {
  double* f[6] = {&c.sec_per_flop, &c.sec_per_att_flop, &c.sec_per_byte_intra,
                  &c.sec_per_byte_inter, &c.sec_per_step, &c.sec_per_seq};
  return *f[i];
}

}  // namespace

CostCoeffs refit(const CostModel& model, const std::vector<TimingObservation>& obs, double prior_weight) {
  constexpr int n = 6;
  CostCoeffs prior = model.coeffs();
  for (int i = 0; i < n; ++i)
    DHP_CHECK(coeff(prior, i) > 0, "refit: the prior cost coefficients must be positive");
  std::vector<std::vector<SeqCost>> costs;
  for (const auto& o : obs) {
    DHP_CHECK(o.seconds > 0 && o.degree >= 1, "refit: an observation needs seconds > 0 and degree >= 1");
    costs.emplace_back();
    for (const auto& s : o.seqs) costs.back().push_back(model.prepare(s));
  }
  CostModel work = model;
  CostCoeffs cur = prior;
  // Unknowns are x_i = c_i / prior_i so every column has the scale of the prior's prediction.
  for (int iter = 0; iter < 8; ++iter) {
    work.set_coeffs(cur);
    std::vector<double> ata(n * n, 0.0), atb(n, 0.0);
    for (size_t o = 0; o < obs.size(); ++o) {
      std::vector<double> row(n, 0.0);
      for (const auto& c : costs[o]) {
        auto f = work.features(c, obs[o].degree);
        for (int i = 0; i < n; ++i) row[i] += f[i] * coeff(prior, i) / obs[o].seconds;
      }
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) ata[i * n + j] += row[i] * row[j];
        atb[i] += row[i];
      }
    }
    for (int i = 0; i < n; ++i) ata[i * n + i] += prior_weight, atb[i] += prior_weight;
    auto x = solve_linear(ata, atb, n);
    CostCoeffs next = prior;
    bool moved = false;
    for (int i = 0; i < n; ++i) {
      // Negative rates are meaningless; keep a small positive floor instead.
      double v = coeff(prior, i) * std::max(x[i], 1e-3);
      moved |= std::fabs(v - coeff(cur, i)) > 1e-9 * std::fabs(coeff(cur, i));
      coeff(next, i) = v;
    }
    cur = next;
    if (!moved) break;
  }
  return cur;
}

}  // namespace dhp
