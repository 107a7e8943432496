#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace dhp {

double learning_rate(const OptimConfig& o, int64_t step, int64_t total_steps) {
  if (o.warmup > 0 && step < o.warmup) return o.lr * double(step + 1) / double(o.warmup);
  const int64_t decay_steps = total_steps - o.warmup;
  if (decay_steps <= 1) return o.lr;
  const double progress = std::min(1.0, double(step - o.warmup) / double(decay_steps - 1));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(const ParamTable& table, const OptimConfig& cfg, Backend& backend,
             OptimizerShard shard)
    : table_(table), cfg_(cfg), backend_(backend), shard_(shard) {
  DHP_ASSERT(shard.world >= 1 && shard.rank >= 0 && shard.rank < shard.world);
  n_ = table.trainable_total();
  layout_ = CompactShard{shard, n_};
  m_ = DeviceBuffer(backend, sizeof(float) * size_t(layout_.held_size()));
  v_ = DeviceBuffer(backend, sizeof(float) * size_t(layout_.held_size()));
  norm_ = DeviceBuffer(backend, sizeof(double));
  backend_.zero(m_.data(), m_.bytes());
  backend_.zero(v_.data(), v_.bytes());
}

double AdamW::squared_norm(const float* x, int64_t n) const {
  if (n == 0) return 0.0;
  backend_.ops().sum_squares(norm_.as<double>(), x, n);
  double sq = 0.0;
  backend_.download(&sq, norm_.data(), sizeof(sq));
  return sq;
}

double AdamW::grad_norm(const float* grads) const {
  return std::sqrt(squared_norm(grads, n_));
}

void AdamW::clip(float* grads, double norm) const {
  if (cfg_.grad_clip <= 0.0 || norm <= cfg_.grad_clip) return;
  backend_.ops().scale_inplace(grads, float(cfg_.grad_clip / (norm + 1e-6)), n_);
}

AdamWStep AdamW::step_of(const ParamSpec& p, double lr) const {
  lr *= table_.groups()[p.group].lr_scale;
  return AdamWStep{float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                   p.decay ? float(cfg_.weight_decay) : 0.0f, t_};
}

void AdamW::update(float* params, const float* grads, double lr) {
  DHP_ASSERT(!sharded());
  ++t_;
  for (const auto& p : table_.specs())
    if (p.trainable)
      backend_.ops().adamw_update(params + p.offset, grads + p.grad_offset, m() + p.grad_offset,
                                  v() + p.grad_offset, p.numel(), step_of(p, lr));
}

void AdamW::set_overlap(int64_t bucket_elements) {
  buckets_.clear();
  if (bucket_elements <= 0) return;
  const auto& specs = table_.specs();
  int64_t end = n_, size = 0;
  for (auto it = specs.rbegin(); it != specs.rend(); ++it) {
    if (!it->trainable) continue;
    size += it->numel();
    if (size >= bucket_elements) {
      buckets_.push_back({it->grad_offset, end});
      end = it->grad_offset;
      size = 0;
    }
  }
  if (end > 0) buckets_.push_back({0, end});
}

void AdamW::begin_overlap(float* grads, Communicator& comm) {
  DHP_ASSERT(overlaps() && inflight_.empty());
  overlap_grads_ = grads;
  overlap_comm_ = &comm;
  started_ = 0;
}

void AdamW::start(const Bucket& b) {
  Communicator& comm = *overlap_comm_;
  float* g = overlap_grads_;
  if (!sharded()) {
    inflight_.push_back(comm.start_all_reduce(g + b.begin, b.end - b.begin, DataType::F32, ReduceOp::Sum));
    return;
  }
  const int64_t W = shard_.world;
  for (int r = 0; r < W; ++r) {
    const int64_t a = std::max(b.begin, r * layout_.block()), e = std::min(b.end, (r + 1) * layout_.block());
    if (a < e) inflight_.push_back(comm.start_reduce(g + a, e - a, DataType::F32, r));
  }
  const int64_t a = std::max(b.begin, layout_.tail_begin());
  if (a < b.end) inflight_.push_back(comm.start_all_reduce(g + a, b.end - a, DataType::F32, ReduceOp::Sum));
}

void AdamW::grads_final_from(int64_t offset) {
  if (!overlap_grads_) return;
  while (started_ < buckets_.size() && buckets_[started_].begin >= offset) start(buckets_[started_++]);
  for (auto& x : inflight_) x->test();  // lets the transport progress between layers
}

double AdamW::sharded_norm(const float* grads, Communicator& comm) const {
  // Blocks summed in rank order; the tail (the same on every rank) counted once.
  double sq = squared_norm(grads + layout_.lo(), layout_.block());
  if (shard_.rank == 0) sq += squared_norm(grads + layout_.tail_begin(), layout_.tail());
  comm.all_reduce_sum(&sq, 1);
  return std::sqrt(sq);
}

double AdamW::reduce(float* grads, Communicator& comm) {
  if (overlap_grads_) {
    DHP_ASSERT(grads == overlap_grads_ && &comm == overlap_comm_);
    grads_final_from(0);
    for (auto& x : inflight_) x->wait();
    inflight_.clear();
    overlap_grads_ = nullptr;
    if (!sharded()) return grad_norm(grads);
    return sharded_norm(grads, comm);  // this rank's block was summed in place
  }
  if (!sharded()) {
    comm.all_reduce_sum(grads, n_);
    return grad_norm(grads);
  }
  comm.reduce_scatter(grads, grads + layout_.lo(), layout_.block(), DataType::F32);
  if (layout_.tail() > 0) comm.all_reduce_sum(grads + layout_.tail_begin(), layout_.tail());
  return sharded_norm(grads, comm);
}

template <class Weight>
void AdamW::update_held(float* grads, double lr, double norm, Weight&& weight) {
  if (cfg_.grad_clip > 0.0 && norm > cfg_.grad_clip) {
    const float s = float(cfg_.grad_clip / (norm + 1e-6));
    backend_.ops().scale_inplace(grads + layout_.lo(), s, layout_.block());  // this rank's summed block
    if (layout_.tail() > 0) backend_.ops().scale_inplace(grads + layout_.tail_begin(), s, layout_.tail());
  }
  ++t_;
  for (const auto& p : table_.specs()) {
    if (!p.trainable) continue;
    layout_.for_each_held(p.grad_offset, p.grad_offset + p.numel(),
                          [&](const CompactShard::Range& h, int64_t a, int64_t b) {
                            const int64_t at = h.local + (a - h.begin);
                            backend_.ops().adamw_update(weight(p, h, a), grads + a, m() + at, v() + at,
                                                        b - a, step_of(p, lr));
                          });
  }
}

void AdamW::apply(float* params, float* grads, double lr, double norm, Communicator& comm) {
  if (!sharded()) {
    clip(grads, norm);
    update(params, grads, lr);
    return;
  }
  // The weight of gradient offset a lives at params + (p.offset - p.grad_offset) + a.
  update_held(grads, lr, norm, [params](const ParamSpec& p, const CompactShard::Range&, int64_t a) {
    return params + (p.offset - p.grad_offset) + a;
  });
  gather_params(params, grads, comm);
}

void AdamW::apply(Model& model, double lr, double norm, Communicator& comm) {
  if (!model.sheds_master()) {
    apply(model.params(), model.grads(), lr, norm, comm);
    return;
  }
  DHP_ASSERT(model.master_shard().shard.rank == shard_.rank && model.master_shard().shard.world == shard_.world &&
             model.master_shard().n == n_);
  float* master = model.master();  // laid out as the moments are
  update_held(model.grads(), lr, norm, [master](const ParamSpec&, const CompactShard::Range& h, int64_t a) {
    return master + h.local + (a - h.begin);
  });
  refresh_working(model, comm);
}

void AdamW::refresh_working(Model& model, Communicator& comm) const {
  const Ops& ops = backend_.ops();
  const Act work = model.working();
  const float* master = model.master();
  const DataType type = data_type_of(work.t);
  const int64_t lo = layout_.lo(), t0 = layout_.tail_begin();
  if (table_.all_trainable()) {  // the layouts coincide: round into place, gather in place
    ops.cast(work + lo, master, layout_.block());
    if (layout_.tail() > 0) ops.cast(work + t0, master + layout_.block(), layout_.tail());
    comm.all_gather((work + lo).p, work.p, layout_.block(), type);
    return;
  }
  // The blocks gathered in the gradient layout through the gradient arena (its sums are
  // spent), each piece then copied to its weight's place; the tail rounded in place.
  const Act staged(model.grads(), work.t);
  ops.cast(staged + lo, master, layout_.block());
  comm.all_gather((staged + lo).p, staged.p, layout_.block(), type);
  for (const auto& p : table_.specs()) {
    if (!p.trainable) continue;
    const int64_t begin = p.grad_offset, end = p.grad_offset + p.numel(), to_weight = p.offset - p.grad_offset;
    if (const int64_t b = std::min(end, t0); begin < b)
      backend_.copy((work + (begin + to_weight)).p, (staged + begin).p, dtype_size(work.t) * size_t(b - begin));
    if (const int64_t a = std::max(begin, t0); a < end)
      ops.cast(work + (a + to_weight), master + layout_.block() + (a - t0), end - a);
  }
}

void AdamW::gather_params(float* params, float* grads, Communicator& comm) {
  const int64_t lo = layout_.lo();
  if (table_.all_trainable()) {  // the two layouts coincide: gather in place
    comm.all_gather(params + lo, params, layout_.block(), DataType::F32);
    return;
  }
  // Each piece [a, b) of the gradient layout that lies in `range` copied between the layouts.
  auto pieces = [&](int64_t r0, int64_t r1, bool to_grads) {
    for (const auto& p : table_.specs()) {
      if (!p.trainable) continue;
      const int64_t a = std::max(p.grad_offset, r0), b = std::min(p.grad_offset + p.numel(), r1);
      if (a >= b) continue;
      float* w = params + (p.offset - p.grad_offset) + a;
      if (to_grads) backend_.copy(grads + a, w, sizeof(float) * size_t(b - a));
      else backend_.copy(w, grads + a, sizeof(float) * size_t(b - a));
    }
  };
  // The tail was updated identically on every rank; only the blocks travel.
  pieces(lo, lo + layout_.block(), true);
  comm.all_gather(grads + lo, grads, layout_.block(), DataType::F32);
  pieces(0, lo, false);
  pieces(lo + layout_.block(), layout_.tail_begin(), false);
}

std::vector<float> AdamW::gather(const DeviceBuffer& b, Communicator& comm) const {
  DeviceBuffer all(backend_, sizeof(float) * size_t(layout_.tail_begin()));
  comm.all_gather(b.data(), all.data(), layout_.block(), DataType::F32);
  std::vector<float> host(static_cast<size_t>(n_));
  backend_.download(host.data(), all.data(), all.bytes());
  if (layout_.tail() > 0)
    backend_.download(host.data() + layout_.tail_begin(), b.as<float>() + layout_.block(),
                      sizeof(float) * size_t(layout_.tail()));
  return host;
}

void AdamW::gather_moments(Communicator& comm) {
  if (!sharded()) return;
  full_m_ = gather(m_, comm);
  full_v_ = gather(v_, comm);
}

std::vector<float> AdamW::to_arena_layout(const std::vector<float>& compact) const {
  DHP_ASSERT(int64_t(compact.size()) == n_);
  std::vector<float> full(size_t(table_.total()), 0.0f);
  for (const auto& p : table_.specs())
    if (p.trainable)
      std::copy_n(compact.begin() + p.grad_offset, p.numel(), full.begin() + p.offset);
  return full;
}

std::vector<float> AdamW::download_m() const {
  if (sharded()) {
    DHP_ASSERT(!full_m_.empty() || n_ == 0);  // gather_moments first
    return to_arena_layout(full_m_);
  }
  std::vector<float> host(static_cast<size_t>(n_));
  backend_.download(host.data(), m_.data(), m_.bytes());
  return to_arena_layout(host);
}

std::vector<float> AdamW::download_v() const {
  if (sharded()) {
    DHP_ASSERT(!full_v_.empty() || n_ == 0);
    return to_arena_layout(full_v_);
  }
  std::vector<float> host(static_cast<size_t>(n_));
  backend_.download(host.data(), v_.data(), v_.bytes());
  return to_arena_layout(host);
}

void AdamW::upload_moments(const std::vector<float>& m, const std::vector<float>& v) {
  DHP_ASSERT(int64_t(m.size()) == table_.total() && int64_t(v.size()) == table_.total());
  const int64_t lo = layout_.lo(), tail0 = layout_.tail_begin();
  // A frozen parameter's moments are dropped; one trainable now but frozen when the
  // checkpoint was written finds zeros there and starts afresh.
  std::vector<float> compact(static_cast<size_t>(n_));
  for (auto [dst, src] : {std::pair{&m_, &m}, std::pair{&v_, &v}}) {
    for (const auto& p : table_.specs())
      if (p.trainable)
        std::copy_n(src->begin() + p.offset, p.numel(), compact.begin() + p.grad_offset);
    backend_.upload(dst->data(), compact.data() + lo, sizeof(float) * size_t(layout_.block()));
    if (layout_.tail() > 0)
      backend_.upload(dst->as<float>() + layout_.block(), compact.data() + tail0,
                      sizeof(float) * size_t(layout_.tail()));
  }
}

std::pair<int64_t, int64_t> AdamW::save_part(int64_t n, int rank, int world) {
  const int64_t s = n / world;
  return {rank * s, rank + 1 == world ? n : (rank + 1) * s};
}

bool AdamW::holds_any(int64_t begin, int64_t end) const {
  bool any = false;
  layout_.for_each_held(begin, end, [&](const CompactShard::Range&, int64_t, int64_t) { any = true; });
  return any;
}

void AdamW::download_compact(int64_t begin, int64_t count, float* m, float* v) const {
  int64_t copied = 0;
  layout_.for_each_held(begin, begin + count, [&](const CompactShard::Range& h, int64_t a, int64_t b) {
    const size_t bytes = sizeof(float) * size_t(b - a);
    backend_.download(m + (a - begin), this->m() + h.local + (a - h.begin), bytes);
    backend_.download(v + (a - begin), this->v() + h.local + (a - h.begin), bytes);
    copied += b - a;
  });
  DHP_ASSERT(copied == count);
}

void AdamW::upload_compact(int64_t begin, int64_t count, const float* m, const float* v) {
  layout_.for_each_held(begin, begin + count, [&](const CompactShard::Range& h, int64_t a, int64_t b) {
    const size_t bytes = sizeof(float) * size_t(b - a);
    backend_.upload(this->m() + h.local + (a - h.begin), m + (a - begin), bytes);
    backend_.upload(this->v() + h.local + (a - h.begin), v + (a - begin), bytes);
  });
}

std::vector<float> gather_weights(const Model& model, Communicator& comm) {
  if (!model.sheds_master()) return comm.rank() == 0 ? model.download_params() : std::vector<float>{};
  const CompactShard& lay = model.master_shard();
  const ParamTable& table = model.table();
  Backend& backend = model.backend();
  constexpr int64_t kChunk = int64_t(1) << 22;
  // Rank 0 holds its block and the tail already (read_params); rank r > 0 sends block r.
  std::vector<float> host;
  if (comm.rank() == 0) host = model.download_params();
  DeviceBuffer staged(backend, comm.rank() == 0 ? sizeof(float) * size_t(std::min(lay.block(), kChunk)) : 0);
  std::vector<float> chunk;
  for (int r = 1; r < lay.shard.world; ++r) {
    const int64_t block0 = int64_t(r) * lay.block();
    for (int64_t i = 0; i < lay.block(); i += kChunk) {
      const int64_t c = std::min(kChunk, lay.block() - i);
      if (comm.rank() == r) {
        comm.exchange({Transfer::send(0, model.master() + i, c)})->wait();
      } else if (comm.rank() == 0) {
        comm.exchange({Transfer::recv(r, staged.as<float>(), c)})->wait();
        chunk.resize(size_t(c));
        backend.download(chunk.data(), staged.data(), sizeof(float) * size_t(c));
        // Compact range [block0 + i, + c) to the weights' places.
        for (const ParamSpec& p : table.specs()) {
          const int64_t a = std::max(block0 + i, p.grad_offset), b = std::min(block0 + i + c, p.grad_offset + p.numel());
          if (p.trainable && a < b)
            std::copy_n(chunk.data() + (a - block0 - i), b - a, host.data() + p.offset + (a - p.grad_offset));
        }
      }
    }
  }
  return host;
}

}  // namespace dhp
