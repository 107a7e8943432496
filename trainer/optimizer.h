// AdamW with decoupled weight decay (flagged per parameter in the parameter table), global-norm
// gradient clipping and the warm-up + cosine learning-rate schedule, replicated on every rank
// or sharded over the ranks (ZeRO-1 and 2, parallel.zero; the partition is model/shard.h's).
//
// Frozen parameter groups (optim.groups.<name>.trainable = false) have no gradient, moment,
// weight decay or update: everything below runs over the gradient layout of the parameter
// table (ParamSpec::grad_offset), which holds the trainable parameters only, and an update
// maps a gradient offset back to its parameter's offset in the weight arena. The learning
// rate of each parameter is the schedule's times its group's lr_scale.
//
// ZeRO-1: the flat gradient arena of n trainable elements is cut into one contiguous block of
// s = floor(n / N) elements per rank, plus a tail of n - N·s < N elements that every rank
// keeps. Gradients are reduce-scattered in place (each rank's block of the arena receives its
// sum; no second buffer) and the tail all-reduced; the global norm is summed from the blocks; each rank updates its block
// and the tail, and the parameters are all-gathered. Moments exist for a rank's block and the
// tail only: optimizer memory per rank falls by N. With a frozen group the updated block is
// gathered through the gradient arena (its sums are spent by then) and copied back to the
// weights, whose layout differs from the gradients' there.
//
// The distributed optimizer: where the working weights are narrower than fp32 (bf16), a
// sharded rank's model holds the fp32 master of its block and the tail alone, and the update
// writes there (apply(Model&)): each rank rounds its updated block into the working copy and
// the blocks are all-gathered in bf16, half of fp32's traffic; the tail, updated alike on
// every rank, is rounded in place. Rounding the same fp32 values gives the same bf16 as the
// replicated path's rounding of its whole master, so the two agree bit for bit.
//
// ZeRO-2 (parallel.zero = 2): the summed gradients of a rank's block and the tail come from a
// GradReducer (trainer/grad_reducer.h), which summed them wave by wave while backward went on;
// the norm, clipping and update read them there, and the gathers after the update stage their
// blocks through the model's gradient window, a chunk of each block at a time where the
// window is smaller than the gradient layout (frozen groups).
//
// Overlapped reduction (parallel.overlap_grads, where the communicator overlaps collectives):
// the arena is cut into buckets of about parallel.bucket_mb, from its end, at parameter
// boundaries. During a step's last backward pass on this rank the model reports how far, from
// the end of the arena backwards, the gradients are final (grads_final_from); each bucket's
// sum starts as soon as the bucket is final, while backward goes on — all-reduced, or under
// ZeRO-1 reduced onto the ranks that own its parts and the tail all-reduced — and reduce()
// then starts the rest and waits. The buckets are fixed by the parameter table, so every rank
// starts the same reductions in the same order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/model.h"
#include "model/params.h"
#include "model/shard.h"
#include "parallel/communicator.h"
#include "trainer/config.h"
#include "trainer/grad_reducer.h"

namespace dhp {

// Linear warm-up from lr/warmup to lr over `warmup` steps, then cosine decay to min_lr at the
// last step. `step` counts from 0.
double learning_rate(const OptimConfig& o, int64_t step, int64_t total_steps);

class AdamW {
 public:
  AdamW(const ParamTable& table, const OptimConfig& cfg, Backend& backend,
        OptimizerShard shard = {});

  // Sums the gradients over the ranks (all-reduce, or reduce-scatter to this rank's block
  // under ZeRO-1) and returns their global L2 norm. Every rank calls it.
  double reduce(float* grads, Communicator& comm);
  // Clips to cfg.grad_clip by `norm`, updates with learning rate lr (this rank's block under
  // ZeRO-1, then the parameters are all-gathered) and counts the step. Every rank calls it.
  void apply(float* params, float* grads, double lr, double norm, Communicator& comm);
  // The same on a model's weights: where the model holds the master of this rank's shard alone
  // (Model::sheds_master), that master is updated, rounded into the working copy, and the
  // working copy's blocks all-gathered in the storage dtype.
  void apply(Model& model, double lr, double norm, Communicator& comm);

  // ZeRO-2: the same from a GradReducer (trainer/grad_reducer.h) that has summed every wave
  // of the step; reduce() sums the rest of its window first.
  double reduce(GradReducer& sums, Communicator& comm);
  void apply(Model& model, GradReducer& sums, double lr, double norm, Communicator& comm);

  // Turns overlapped reduction on with buckets of about `bucket_elements` (0: off).
  void set_overlap(int64_t bucket_elements);
  bool overlaps() const { return !buckets_.empty(); }
  int64_t buckets() const { return int64_t(buckets_.size()); }
  // Before a step's backward passes (overlaps() only): reductions of this step go on `grads`.
  void begin_overlap(float* grads, Communicator& comm);
  // Every gradient at offset >= `offset` is final for this step: start the buckets that are.
  void grads_final_from(int64_t offset);

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  bool sharded() const { return shard_.world > 1; }
  // Bytes of moments this rank holds.
  int64_t state_bytes() const { return int64_t(m_.bytes() + v_.bytes()); }

  // The full moments on the host for a checkpoint, in the weight arena's layout (table total
  // floats) with zeros for frozen parameters. Sharded, every rank first calls gather_moments
  // (a collective); then download_* return the gathered copies.
  void gather_moments(Communicator& comm);
  std::vector<float> download_m() const;
  std::vector<float> download_v() const;
  // Full moments from a checkpoint (weight arena layout): the trainable parameters' are kept,
  // a sharded rank keeps its block and the tail.
  void upload_moments(const std::vector<float>& m, const std::vector<float>& v);
  // A checkpoint of several ranks (trainer/checkpoint.h) saves the moments in the gradient
  // layout ("compact": the trainable parameters only) as `world` contiguous parts, part r of
  // n elements being ZeRO-1's block r and the last part also the tail: each rank saves what
  // it holds, replicated or sharded. [begin, end) of part `rank`.
  static std::pair<int64_t, int64_t> save_part(int64_t n, int rank, int world);
  int64_t compact_size() const { return n_; }
  // Copies compact range [begin, begin + count) of the moments to the host; this rank holds
  // all of it.
  void download_compact(int64_t begin, int64_t count, float* m, float* v) const;
  // Takes the moments of compact range [begin, begin + count) that this rank holds from the
  // host (none when it holds none of the range).
  void upload_compact(int64_t begin, int64_t count, const float* m, const float* v);
  // Whether this rank holds any of compact range [begin, end).
  bool holds_any(int64_t begin, int64_t end) const;

  // Device pointers to the moments this rank holds (all of them when not sharded).
  float* m() { return m_.as<float>(); }
  float* v() { return v_.as<float>(); }
  const float* m() const { return m_.as<float>(); }
  const float* v() const { return v_.as<float>(); }

 private:
  // The replicated path: the norm of a whole gradient arena, clipping, and an update of every
  // parameter.
  double grad_norm(const float* grads) const;
  void clip(float* grads, double norm) const;
  void update(float* params, const float* grads, double lr);
  AdamWStep step_of(const ParamSpec& p, double lr) const;
  double squared_norm(const float* x, int64_t n) const;
  // Under ZeRO-1, once this rank's block of the arena and the tail hold their sums: the global
  // norm; from the block's and the tail's sums wherever they are.
  double sharded_norm(const float* grads, Communicator& comm) const;
  double sharded_norm(const float* block, const float* tail, Communicator& comm) const;
  // Under ZeRO-1 and 2: clips and updates what this rank holds, the summed gradients of its
  // block at `block` and of the tail at `tail`; `weight(p, h, a)` is where the weight of
  // gradient offset a (of parameter p, in held range h) lives.
  using WeightAt = std::function<float*(const ParamSpec&, const CompactShard::Range&, int64_t)>;
  void update_held(float* block, float* tail, double lr, double norm, const WeightAt& weight);
  // The weights in the fp32 arena, or in a model's sharded master.
  static WeightAt in_arena(float* params);
  WeightAt in_master(Model& model) const;
  // After a sharded update of the master: the working copy of every block.
  void refresh_working(Model& model, Communicator& comm) const;
  struct Bucket {
    int64_t begin, end;  // [begin, end) of the arena
  };
  void start(const Bucket& b);
  // The compact moments (gradient layout) gathered onto the host.
  std::vector<float> gather(const DeviceBuffer& b, Communicator& comm) const;
  std::vector<float> to_arena_layout(const std::vector<float>& compact) const;
  // After a sharded update of frozen-group runs: the parameters of every block all-gathered,
  // through `staging` (room for `room` floats).
  void gather_params(float* params, float* staging, int64_t room, Communicator& comm);
  // Every rank's block of the gradient layout gathered through `staging` (room for `room`
  // elements of its type), a chunk of each block at a time: mine(dst, a, b) stages this rank's
  // range [a, b), place(src, a, b) puts range [a, b) of another rank's block where it belongs.
  // Where the staging holds every block (a whole gradient arena) that is one all-gather; a
  // ZeRO-2 gradient window takes a few.
  template <class Mine, class Place>
  void gather_blocks(Act staging, int64_t room, Communicator& comm, Mine&& mine, Place&& place) const;
  const ParamTable& table_;
  OptimConfig cfg_;
  Backend& backend_;
  OptimizerShard shard_;
  CompactShard layout_;           // what shard_ holds of the gradient layout
  int64_t n_ = 0;                 // elements of the gradient layout (trainable parameters)
  DeviceBuffer m_, v_;            // (block + tail) moments
  DeviceBuffer norm_;             // (1) double: a squared norm
  std::vector<float> full_m_, full_v_;  // gathered for a checkpoint (sharded only)
  std::vector<Bucket> buckets_;         // in starting order: from the end of the arena
  size_t started_ = 0;                  // buckets started this step
  std::vector<std::unique_ptr<PendingExchange>> inflight_;
  float* overlap_grads_ = nullptr;      // non-null between begin_overlap and reduce
  Communicator* overlap_comm_ = nullptr;
  int64_t t_ = 0;
};

// The fp32 weights on rank 0's host, whole: where the master is sharded, the working copy
// widened, with the master of every trainable parameter sent to rank 0 by the rank holding it,
// a chunk at a time. Every rank calls it; the others get an empty vector.
std::vector<float> gather_weights(const Model& model, Communicator& comm);

}  // namespace dhp
