// The execution of a step's plan (design.md §2, §4), shared by training and evaluation.
//
// Every rank computes the same plan from the sampled batch's lengths alone (the planner of
// parallel.strategy: dhp, static or pow2). A rank then decodes, in the background, only its
// pieces: the zigzag token ranges of each group it holds tokens in, with the whole images
// those ranges touch. It runs its groups in the plan's start order — the same order on every
// rank, so rings never wait on each other in a cycle — each group as one micro-batch whose
// decoder attention is a ring over the group's ranks (local attention for a group of one).
// Gradients accumulate over the groups; the caller sums them over ranks once per step.
//
// Inside a ring group every image is encoded once, on the rank the routing gives it (by
// patch count, parallel/image_routing.h), and its merged tokens travel to the ranks holding
// their positions (parallel/image_exchange.h): a rank decodes the images it encodes and the text of its
// pieces, nothing else. Gradients of the tokens come back the same way, so the summed
// gradient is exact.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "model/model.h"
#include "trainer/grad_reducer.h"
#include "parallel/communicator.h"
#include "parallel/image_exchange.h"
#include "parallel/image_routing.h"
#include "parallel/plan.h"
#include "parallel/planner.h"
#include "parallel/ring_attention.h"

namespace dhp {

// What the planner knows of a sample: lengths from the dataset's index, no pixels.
SeqShape shape_of(const Dataset& data, int64_t i);

// One group of the plan, as this rank runs it.
struct GroupWork {
  int group = 0;              // index into Plan::groups()
  std::vector<int> ring;      // world ranks holding the group's tokens, in ring order
  std::vector<Piece> pieces;  // this rank's token ranges, in order
  std::vector<int32_t> docs;  // the group's sequence index of each piece: the ring's doc id
  // Ring groups with images: the images move between ranks (routed = true). Then `pieces`
  // are text only and each image this rank encodes is one load after them.
  bool routed = false;
  ImageRouting routing;
  std::vector<Piece> loads() const;  // pieces, then one load per image to encode
};

struct StepWork {
  Plan plan;
  std::vector<GroupWork> mine;  // groups where this rank holds tokens, in start order
  int64_t loss_tokens = 0;      // of the whole global batch
  int64_t tokens = 0;
  int64_t samples = 0;
  double plan_seconds = 0.0;    // wall time of planning
  std::vector<Piece> my_loads() const;  // every group's loads(), in order
};

// The plan of one global batch (dataset indices) and this rank's share of it.
StepWork plan_step(const Planner& planner, const Dataset& data, const std::vector<int64_t>& ids,
                   int rank);

// A group this rank ran. Busy time is the rank's thread CPU time (true busy time even with
// more ranks than cores) less what it spent inside ring waits; with several compute threads
// per rank (whose CPU time the calling thread does not see), or on a device (which runs the
// queued kernels after the host), it is wall time to the group's end less the waits.
struct GroupTiming {
  int group = 0;
  double busy_seconds = 0.0;
  double wait_seconds = 0.0;  // wall time waiting for ring neighbours
};

class Executor {
 public:
  Executor(Model& model, const Dataset& data, int workers, Communicator& comm);
  // Starts decoding this rank's pieces of `work`. Submit a step before running the one before
  // it, so decoding overlaps compute; runs take submissions in order. Thread-safe.
  void submit(const StepWork& work, bool blank_images);
  // Runs this rank's groups of `work` (submitted earlier) through the model and returns this
  // rank's loss statistics. `after` sees each group's samples once its pass is done.
  // `last_final` hears the gradients completed by this rank's last pass of the step (nothing
  // touches them after it): the optimizer overlaps their reduction with the rest of backward.
  // `waves` (ZeRO-2): sums every wave's gradients as its pass goes (trainer/grad_reducer.h);
  // this rank takes part in each wave of the plan, with its group there or with none. So it
  // does wherever the model gathers its decoder layers (ZeRO-3: Model::layer_feed), training
  // or not.
  StepStats run(const StepWork& work, float loss_scale, bool backward,
                const std::function<void(const std::vector<Sample>&)>& after = {},
                const GradsFinal& last_final = {}, GradReducer* waves = nullptr);
  double last_wait_seconds() const { return loader_.last_wait_seconds(); }
  // Images this rank encoded in the last run (each image of a ring group on one rank only).
  int64_t last_images_encoded() const { return images_encoded_; }
  const std::vector<GroupTiming>& last_timings() const { return timings_; }

 private:
  using Clock = std::chrono::steady_clock;
  void encode_routed(const GroupWork& g, const Sample* loaded, Batch& b);
  GroupTiming time_group(const GroupWork& g, Clock::time_point wall0, double cpu0);

  Model& model_;
  Communicator& comm_;
  BatchLoader loader_;
  RingAttention ring_;     // regrouped for every group of more than one rank
  ImageExchange images_;   // prepared for every routed group
  int64_t images_encoded_ = 0;
  std::vector<const Sample*> ptrs_;
  std::vector<GroupTiming> timings_;
};

}  // namespace dhp
