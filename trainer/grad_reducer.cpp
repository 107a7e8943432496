#include "trainer/grad_reducer.h"

#include <algorithm>

#include "core/check.h"

namespace dhp {

GradReducer::GradReducer(Model& model, OptimizerShard shard, Communicator& comm)
    : model_(model),
      window_(model.grad_window()),
      layout_{shard, model.n_grads()},
      comm_(comm),
      backend_(model.backend()),
      shard_(model.backend(), sizeof(float) * size_t(layout_.held_size())) {
  DHP_ASSERT(shard.world == comm.size() && shard.rank == comm.rank());
  backend_.zero(shard_.data(), shard_.bytes());
}

void GradReducer::begin_step() {
  DHP_ASSERT(sums_.empty() && next_ < 0);
  backend_.zero(shard_.data(), shard_.bytes());
  model_.zero_grads();
}

void GradReducer::start(float* buf, int64_t begin, int64_t end) {
  Sum s{buf, begin, end, {}};
  if (begin < end && !comm_.overlapping_collectives()) {
    // Every rank gets the sum; each keeps its parts.
    comm_.all_reduce_sum(buf, end - begin);
  } else if (begin < end) {
    layout_.for_each_block(begin, end, [&](int r, int64_t a, int64_t e) {
      s.parts.push_back(comm_.start_reduce(buf + (a - begin), e - a, DataType::F32, r));
    });
    if (const int64_t a = std::max(begin, layout_.tail_begin()); a < end)
      s.parts.push_back(comm_.start_all_reduce(buf + (a - begin), end - a, DataType::F32, ReduceOp::Sum));
  }
  sums_.push_back(std::move(s));
}

void GradReducer::settle() {
  DHP_ASSERT(!sums_.empty());
  Sum& s = sums_.front();
  for (auto& p : s.parts) p->wait();
  layout_.for_each_held(s.begin, s.end, [&](const CompactShard::Range& h, int64_t a, int64_t b) {
    backend_.copy(held() + h.local + (a - h.begin), s.buf + (a - s.begin), sizeof(float) * size_t(b - a));
  });
  backend_.zero(s.buf, sizeof(float) * size_t(s.end - s.begin));
  sums_.pop_front();
}

void GradReducer::preload(int l) {
  const int64_t begin = window_.layer[size_t(l)], end = window_.layer[size_t(l) + 1];
  float* buf = slot(l);
  layout_.for_each_held(begin, end, [&](const CompactShard::Range& h, int64_t a, int64_t b) {
    const bool tail = h.begin == layout_.tail_begin();
    if (!tail || layout_.shard.rank == 0)
      backend_.copy(buf + (a - begin), held() + h.local + (a - h.begin), sizeof(float) * size_t(b - a));
  });
}

void GradReducer::layer_done(int l) {
  start(slot(l), window_.layer[size_t(l)], window_.layer[size_t(l) + 1]);
  // Layer l - 1 fills the slot layer l + 1 used.
  if (l + 1 < window_.layers()) settle();
  if (l >= 1) preload(l - 1);
}

GradsFinal GradReducer::pass() {
  DHP_ASSERT(sums_.empty() && next_ < 0);
  next_ = window_.layers() - 1;
  if (next_ >= 0) preload(next_);
  return [this](int64_t offset) {
    while (next_ >= 0 && offset <= window_.layer[size_t(next_)]) layer_done(next_--);
  };
}

void GradReducer::pass_done() {
  DHP_ASSERT(next_ < 0);  // the pass reported every layer
  while (!sums_.empty()) settle();
}

void GradReducer::no_pass() {
  model_.skip_pass(true, pass());
  pass_done();
}

void GradReducer::finish() {
  DHP_ASSERT(sums_.empty() && next_ < 0);
  float* rest = model_.grad_buffer();
  start(rest, 0, window_.first());
  start(rest + window_.first(), window_.last(), window_.n);
  settle();
  settle();
}

}  // namespace dhp
