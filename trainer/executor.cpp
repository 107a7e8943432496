#include "trainer/executor.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "common/clock.h"
#include "data/pack.h"
#include "kernels/check.h"

namespace dhp {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

SeqShape shape_of(const Dataset& data, int64_t i) {
  SeqShape s;
  s.id = i;
  s.vision_tokens = data.vision_tokens(i);
  s.text_tokens = data.length(i) - s.vision_tokens;
  s.images = data.images(i);
  return s;
}

std::vector<Piece> StepWork::my_pieces() const {
  std::vector<Piece> out;
  for (const auto& g : mine) out.insert(out.end(), g.pieces.begin(), g.pieces.end());
  return out;
}

StepWork plan_step(const Planner& planner, const Dataset& data, const std::vector<int64_t>& ids,
                   int rank) {
  const auto t0 = Clock::now();
  StepWork w;
  std::vector<SeqShape> shapes;
  shapes.reserve(ids.size());
  for (int64_t id : ids) {
    shapes.push_back(shape_of(data, id));
    w.loss_tokens += data.loss_tokens(id);
    w.tokens += shapes.back().tokens();
  }
  w.samples = int64_t(ids.size());
  w.plan = planner.plan(shapes);
  for (int g : w.plan.groups_of(rank)) {
    const PlanGroup& grp = w.plan.groups()[size_t(g)];
    const std::vector<TokenRange> ranges = w.plan.ranges(g, rank);
    if (ranges.empty()) continue;  // one of the group's idle ranks
    GroupWork gw;
    gw.group = g;
    for (int i = 0; i < grp.cp; ++i) gw.ring.push_back(grp.first_rank + i);
    for (const TokenRange& r : ranges) {
      const auto at = std::find(grp.seqs.begin(), grp.seqs.end(), r.seq);
      DHP_ASSERT(at != grp.seqs.end());
      const int32_t doc = int32_t(at - grp.seqs.begin());
      // The last rank of a ring (and the only one of a group of one) holds two adjacent
      // chunks: one piece, so that a sample is never cut where no other rank takes over.
      if (!gw.pieces.empty() && gw.docs.back() == doc && gw.pieces.back().end == r.begin) {
        gw.pieces.back().end = r.end;
        continue;
      }
      gw.pieces.push_back(Piece{w.plan.seqs()[size_t(r.seq)].id, r.begin, r.end});
      gw.docs.push_back(doc);
    }
    w.mine.push_back(std::move(gw));
  }
  w.plan_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return w;
}

Executor::Executor(Model& model, const Dataset& data, int workers, Communicator& comm)
    : model_(model),
      comm_(comm),
      loader_(data, workers),
      ring_(comm, model.backend(), {comm.rank()}) {}

void Executor::submit(const StepWork& work, bool blank_images) {
  loader_.submit(work.my_pieces(), blank_images);
}

StepStats Executor::run(const StepWork& work, float loss_scale, bool backward,
                        const std::function<void(const std::vector<Sample>&)>& after) {
  std::vector<Sample> samples = loader_.next();
  timings_.clear();
  size_t at = 0;
  std::vector<Sample> group_samples;
  for (const GroupWork& g : work.mine) {
    const auto wall0 = Clock::now();
    const double cpu0 = thread_cpu_seconds();
    const size_t n = g.pieces.size();
    DHP_ASSERT(at + n <= samples.size());
    ptrs_.clear();
    for (size_t k = 0; k < n; ++k) ptrs_.push_back(&samples[at + k]);
    Batch b = pack(ptrs_, model_.config().vision);
    // pack() numbers documents by piece; the ring needs the group's sequence index, the same
    // on every rank, so that the two zigzag pieces of a sequence are one document.
    for (auto& d : b.doc) d = g.docs[size_t(d)];
    const DeviceBatch& db = model_.upload(b);
    const bool ring = g.ring.size() > 1;
    if (ring) {
      ring_.regroup(g.ring);
      model_.run(db, loss_scale, backward, &ring_);
    } else {
      model_.run(db, loss_scale, backward);
    }
    const double cpu = thread_cpu_seconds() - cpu0;
    const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
    const double wait = ring ? ring_.wait_seconds() : 0.0;
    const bool one_thread = model_.backend().threads() == 1;
    const double busy = one_thread ? cpu - (ring ? ring_.wait_cpu_seconds() : 0.0) : wall - wait;
    timings_.push_back(GroupTiming{g.group, std::max(0.0, busy), wait});
    if (after) {
      group_samples.assign(std::make_move_iterator(samples.begin() + long(at)),
                           std::make_move_iterator(samples.begin() + long(at + n)));
      after(group_samples);
    }
    at += n;
  }
  DHP_ASSERT(at == samples.size());
  return model_.take_stats();
}

}  // namespace dhp
