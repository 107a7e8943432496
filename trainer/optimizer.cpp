#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "trainer/layer_gather.h"

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

double AdamW::sharded_norm(const float* block, const float* tail, Communicator& comm) const {
  // Blocks summed in rank order; the tail (the same on every rank) counted once.
  double sq = squared_norm(block, layout_.block());
  if (shard_.rank == 0) sq += squared_norm(tail, layout_.tail());
  comm.all_reduce_sum(&sq, 1);
  return std::sqrt(sq);
}

double AdamW::sharded_norm(const float* grads, Communicator& comm) const {
  return sharded_norm(grads + layout_.lo(), grads + layout_.tail_begin(), comm);
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

void AdamW::update_held(float* block, float* tail, double lr, double norm, const WeightAt& weight) {
  if (cfg_.grad_clip > 0.0 && norm > cfg_.grad_clip) {
    const float s = float(cfg_.grad_clip / (norm + 1e-6));
    backend_.ops().scale_inplace(block, s, layout_.block());
    if (layout_.tail() > 0) backend_.ops().scale_inplace(tail, s, layout_.tail());
  }
  ++t_;
  for (const auto& p : table_.specs()) {
    if (!p.trainable) continue;
    layout_.for_each_held(p.grad_offset, p.grad_offset + p.numel(),
                          [&](const CompactShard::Range& h, int64_t a, int64_t b) {
                            const int64_t at = h.local + (a - h.begin);
                            const float* g = (h.local == 0 ? block : tail) + (a - h.begin);
                            backend_.ops().adamw_update(weight(p, h, a), g, m() + at, v() + at, b - a,
                                                        step_of(p, lr));
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
  update_held(grads + layout_.lo(), grads + layout_.tail_begin(), lr, norm, in_arena(params));
  gather_params(params, grads, n_, comm);
}

void AdamW::apply(Model& model, double lr, double norm, Communicator& comm) {
  if (!model.sheds_master()) {
    apply(model.params(), model.grads(), lr, norm, comm);
    return;
  }
  update_held(model.grads() + layout_.lo(), model.grads() + layout_.tail_begin(), lr, norm, in_master(model));
  refresh_working(model, comm);
}

double AdamW::reduce(GradReducer& sums, Communicator& comm) {
  DHP_ASSERT(sharded() && sums.layout().shard.rank == shard_.rank && sums.layout().n == n_);
  sums.finish();
  return sharded_norm(sums.held(), sums.held() + layout_.block(), comm);
}

void AdamW::apply(Model& model, GradReducer& sums, double lr, double norm, Communicator& comm) {
  float* block = sums.held();
  float* tail = block + layout_.block();
  if (model.sheds_master()) {
    update_held(block, tail, lr, norm, in_master(model));
    refresh_working(model, comm);
    return;
  }
  float* params = model.params();
  update_held(block, tail, lr, norm, in_arena(params));
  gather_params(params, model.grad_buffer(), model.grad_window().elements(), comm);
}

auto AdamW::in_arena(float* params) -> WeightAt {
  return [params](const ParamSpec& p, const CompactShard::Range&, int64_t a) {
    return params + (p.offset - p.grad_offset) + a;
  };
}

auto AdamW::in_master(Model& model) const -> WeightAt {
  DHP_ASSERT(model.master_shard().shard.rank == shard_.rank && model.master_shard().shard.world == shard_.world &&
             model.master_shard().n == n_);
  float* master = model.master();  // laid out as the moments are
  return [master](const ParamSpec&, const CompactShard::Range& h, int64_t a) {
    return master + h.local + (a - h.begin);
  };
}

template <class Mine, class Place>
void AdamW::gather_blocks(Act staging, int64_t room, Communicator& comm, Mine&& mine, Place&& place) const {
  const int64_t block = layout_.block(), W = shard_.world;
  const int64_t k = std::min(block, room / W);
  DHP_CHECK(k > 0 || block == 0,
            "the gradient window ({} elements) cannot stage one element of each of the {} ranks' blocks: the "
            "model is too small for parallel.zero = 2 on this many ranks; use parallel.zero = 1", room, W);
  for (int64_t i = 0; i < block; i += k) {
    const int64_t c = std::min(k, block - i);
    mine(staging + int64_t(shard_.rank) * c, layout_.lo() + i, layout_.lo() + i + c);
    comm.all_gather((staging + int64_t(shard_.rank) * c).p, staging.p, c, data_type_of(staging.t));
    for (int r = 0; r < W; ++r)
      if (r != shard_.rank) place(staging + int64_t(r) * c, r * block + i, r * block + i + c);
  }
}

void AdamW::refresh_working(Model& model, Communicator& comm) const {
  const Ops& ops = backend_.ops();
  const Act work = model.working();
  const float* master = model.master();
  const DataType type = data_type_of(work.t);
  const int64_t lo = layout_.lo(), t0 = layout_.tail_begin();
  if (const LayerWindow& weights = model.weight_window(); weights.windowed()) {
    // ZeRO-3: the decoder layers are gathered when a pass needs them; the rest is gathered
    // here as a layer is (trainer/layer_gather.h), staged in the rest of the gradient window
    // (its sums are spent), which holds the gradient layout outside the layers.
    const LayerWindow& grads = model.grad_window();
    const Act staging(model.grad_buffer(), work.t);
    const size_t es = dtype_size(work.t);
    grads.for_each_in_rest(0, layout_.n, [&](int64_t a, int64_t at, int64_t n) {
      gather_master(model, comm, staging + at, a, a + n, nullptr);
      table_.for_each_trainable(a, a + n, [&](int64_t w, int64_t g, int64_t c) {
        backend_.copy((work + weights.at(w)).p, (staging + (at + (g - a))).p, es * size_t(c));
      });
    });
    return;
  }
  if (table_.all_trainable()) {  // the layouts coincide: round into place, gather in place
    ops.cast(work + lo, master, layout_.block());
    if (layout_.tail() > 0) ops.cast(work + t0, master + layout_.block(), layout_.tail());
    comm.all_gather((work + lo).p, work.p, layout_.block(), type);
    return;
  }
  // The blocks gathered in the gradient layout through the model's gradient buffer (its sums
  // are spent), each piece then copied to its weight's place; the tail rounded in place.
  const size_t es = dtype_size(work.t);
  auto place = [&](CAct src, int64_t a, int64_t b) {
    table_.for_each_trainable(a, b, [&](int64_t w, int64_t at, int64_t n) {
      backend_.copy((work + w).p, (src + (at - a)).p, es * size_t(n));
    });
  };
  gather_blocks(Act(model.grad_buffer(), work.t), model.grad_window().elements() * int64_t(sizeof(float) / es), comm,
                [&](Act dst, int64_t a, int64_t b) {
                  ops.cast(dst, master + (a - lo), b - a);
                  place(dst, a, b);
                },
                place);
  table_.for_each_trainable(t0, layout_.n, [&](int64_t w, int64_t at, int64_t n) {
    ops.cast(work + w, master + layout_.block() + (at - t0), n);
  });
}

void AdamW::gather_params(float* params, float* staging, int64_t room, Communicator& comm) {
  const int64_t lo = layout_.lo();
  if (table_.all_trainable()) {  // the two layouts coincide: gather in place
    comm.all_gather(params + lo, params, layout_.block(), DataType::F32);
    return;
  }
  // The tail was updated identically on every rank; only the blocks travel, through the
  // staging buffer (a gradient arena whose sums are spent).
  gather_blocks(Act(staging), room, comm,
                [&](Act dst, int64_t a, int64_t b) {
                  table_.for_each_trainable(a, b, [&](int64_t w, int64_t at, int64_t n) {
                    backend_.copy(static_cast<float*>(dst.p) + (at - a), params + w, sizeof(float) * size_t(n));
                  });
                },
                [&](CAct src, int64_t a, int64_t b) {
                  table_.for_each_trainable(a, b, [&](int64_t w, int64_t at, int64_t n) {
                    backend_.copy(params + w, static_cast<const float*>(src.p) + (at - a), sizeof(float) * size_t(n));
                  });
                });
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
