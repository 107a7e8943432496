#include "trainer/executor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/check.h"
#include "core/clock.h"
#include "data/pack.h"

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
  s.tiles = data.tower_images(i);
  return s;
}

std::vector<Piece> GroupWork::loads() const {
  std::vector<Piece> out = pieces;
  for (int i : routing.encode) {
    const GroupImage& im = routing.images[size_t(i)];
    // The image's own token range overlaps no other image: the load decodes just this one.
    out.push_back(Piece{im.sample, im.span.first, im.span.first + im.span.tokens, false});
  }
  return out;
}

std::vector<Piece> StepWork::my_loads() const {
  std::vector<Piece> out;
  for (const auto& g : mine) {
    const std::vector<Piece> l = g.loads();
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

namespace {

// Group g of `plan` as `rank` runs it; `ranges` are the rank's tokens in the group.
GroupWork group_work(const Plan& plan, int g, int rank, const std::vector<TokenRange>& ranges,
                     const Dataset& data) {
  const PlanGroup& grp = plan.groups()[size_t(g)];
  GroupWork gw;
  gw.group = g;
  for (int i = 0; i < grp.ring_degree; ++i) gw.ring.push_back(grp.first_rank + i);
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
    gw.pieces.push_back(Piece{plan.seqs()[size_t(r.seq)].id, r.begin, r.end, false});
    gw.docs.push_back(doc);
  }
  if (grp.ring_degree > 1) {
    gw.routing = route_images(plan, g, rank - grp.first_rank,
                              [&](int64_t id) { return data.image_spans(id); });
    gw.routed = !gw.routing.empty();
    if (gw.routed)
      for (Piece& p : gw.pieces) p.text_only = true;
  }
  return gw;
}

}  // namespace

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
    const std::vector<TokenRange> ranges = w.plan.ranges(g, rank);
    if (ranges.empty()) continue;  // one of the group's idle ranks
    w.mine.push_back(group_work(w.plan, g, rank, ranges, data));
  }
  w.plan_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return w;
}

Executor::Executor(Model& model, const Dataset& data, int workers, Communicator& comm)
    : model_(model),
      comm_(comm),
      loader_(data, workers),
      ring_(comm, model.backend(), {comm.rank()}),
      images_(comm, model.backend()) {}

void Executor::submit(const StepWork& work, bool blank_images) {
  loader_.submit(work.my_loads(), blank_images);
}

// Adds this rank's encoded images of a routed group to its batch and prepares the exchange
// of their rows. `loaded` holds one load per image the rank encodes, in `encode` order.
void Executor::encode_routed(const GroupWork& g, const Sample* loaded, Batch& b) {
  const ImageRouting& route = g.routing;
  DHP_ASSERT(int64_t(route.slot.size()) == b.T);
  b.image_slot = route.slot;
  b.image_rows = route.rows_received();
  // An image whose load failed (skip mode) is left out and its rows are sent as zeros.
  std::vector<int64_t> first_row(route.encode.size(), -1);
  int64_t rows = 0;
  for (size_t e = 0; e < route.encode.size(); ++e) {
    const Sample& s = loaded[e];
    const GroupImage& im = route.images[size_t(route.encode[e])];
    if (s.skipped || s.images.size() != 1) {
      spdlog::warn("sample {}: the image at tokens [{}, {}) did not load; on its ring those "
                   "tokens are zeros and the rest of the sample trains", im.sample,
                   im.span.first, im.span.first + im.span.tokens);
      continue;
    }
    append_image(b, s.images[0], model_.config().vision);
    first_row[e] = rows;
    rows += im.span.tokens;
    images_encoded_ += s.images[0].tiles;  // the tower's images, as the unrouted count
  }
  images_.prepare(g.ring, route.send_rows(first_row), route.recv, rows,
                  int64_t(model_.config().vision.image_sets()) * model_.config().dim);
}

// Busy time as GroupTiming defines it, from the group's start on both clocks.
GroupTiming Executor::time_group(const GroupWork& g, Clock::time_point wall0, double cpu0) {
  // A device runs the group's kernels after the host has queued them: its busy time is the
  // wall time once they are done.
  const bool on_device = model_.backend().device() != Device::CPU;
  if (on_device) model_.backend().synchronize();
  const double cpu = thread_cpu_seconds() - cpu0;
  const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
  double wait = 0.0, wait_cpu = 0.0;
  if (g.ring.size() > 1) wait += ring_.wait_seconds(), wait_cpu += ring_.wait_cpu_seconds();
  if (g.routed) wait += images_.wait_seconds(), wait_cpu += images_.wait_cpu_seconds();
  const bool one_thread = !on_device && model_.backend().threads() == 1;
  const double busy = one_thread ? cpu - wait_cpu : wall - wait;
  return GroupTiming{g.group, std::max(0.0, busy), wait};
}

StepStats Executor::run(const StepWork& work, float loss_scale, bool backward,
                        const std::function<void(const std::vector<Sample>&)>& after,
                        const GradsFinal& last_final, GradReducer* waves) {
  std::vector<Sample> samples = loader_.next();
  timings_.clear();
  images_encoded_ = 0;
  size_t at = 0;
  std::vector<Sample> group_samples;
  // Whether this rank takes part in every wave: its gradient sums (ZeRO-2) or its gathers of
  // the decoder layers (ZeRO-3, forward-only passes too) are collectives of every rank.
  const bool every_wave = waves || model_.layer_feed();
  const auto skip_wave = [&] {
    if (waves) waves->no_pass();
    else model_.skip_pass(backward);
  };
  int wave = 0;  // the next wave this rank has not taken part in (every_wave only)
  for (const GroupWork& g : work.mine) {
    if (every_wave)
      for (const int mine = work.plan.groups()[size_t(g.group)].wave; wave < mine; ++wave) skip_wave();
    const auto wall0 = Clock::now();
    const double cpu0 = thread_cpu_seconds();
    const size_t n = g.pieces.size(), n_loads = n + g.routing.encode.size();
    DHP_ASSERT(at + n_loads <= samples.size());
    ptrs_.clear();
    for (size_t k = 0; k < n; ++k) ptrs_.push_back(&samples[at + k]);
    Batch b = pack(ptrs_, model_.config().vision);
    // pack() numbers documents by piece; the ring needs the group's sequence index, the same
    // on every rank, so that the two zigzag pieces of a sequence are one document.
    for (auto& d : b.doc) d = g.docs[size_t(d)];
    if (g.routed)
      encode_routed(g, &samples[at + n], b);
    else
      images_encoded_ += int64_t(b.images.size());
    const DeviceBatch& db = model_.upload(b);
    const bool ring = g.ring.size() > 1;
    const GradsFinal none, sums = waves ? waves->pass() : GradsFinal{};
    const GradsFinal& final = waves ? sums : &g == &work.mine.back() ? last_final : none;
    if (ring) ring_.regroup(g.ring);
    model_.run(db, loss_scale, backward, ring ? &ring_ : nullptr, g.routed ? &images_ : nullptr,
               final);
    timings_.push_back(time_group(g, wall0, cpu0));
    if (waves) waves->pass_done();
    if (every_wave) ++wave;
    if (after) {
      group_samples.assign(std::make_move_iterator(samples.begin() + long(at)),
                           std::make_move_iterator(samples.begin() + long(at + n)));
      after(group_samples);
    }
    at += n_loads;
  }
  DHP_ASSERT(at == samples.size());
  if (every_wave)
    for (; wave < work.plan.summary().waves; ++wave) skip_wave();
  return model_.take_stats();
}

}  // namespace dhp
