// ZeRO-2 (parallel.zero = 2): the gradients are summed over the ranks into each rank's fp32
// shard (model/shard.h: its block and the tail) while backward goes on, and no rank holds a
// gradient arena of the whole model: the decoder layers write into the two slots of the
// model's gradient window (model/layer_window.h).
//
// A DHP step runs each rank's groups in waves (parallel/plan.h: a group's wave is the same on
// all its ranks and strictly increases along every rank). Every rank takes part in every wave:
// its group's backward pass (pass(), then pass_done()), or, where it has none, the same sums
// with nothing added (no_pass()). In a wave each layer's slot is summed onto the ranks that own
// its parts (reduce to the owner; the tail all-reduced) as soon as backward leaves the layer,
// and the slot is emptied, once that sum is in, before the layer after next fills it. Every
// rank starts the same sums in the same order (waves, then layers from the last), so a sum of
// wave w waits only for passes of waves <= w, which wait only for sums of earlier waves:
// nothing waits on itself. The rest of the window (tower, projector, embeddings, final norm,
// head) accumulates over the step's passes and is summed once, at finish().
//
// Across waves an owner's shard accumulates: before a layer's slot fills, the owner copies
// what its shard holds of that layer into it (the tail: rank 0 alone), so the backward pass
// adds to it and the sum over ranks brings the rest; the sum is copied back. Within one wave
// this is the replicated sum exactly (0 + g is g); over several waves the order of the terms
// differs from summing each rank's accumulated gradients, so results agree to rounding.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/model.h"
#include "model/shard.h"
#include "parallel/communicator.h"

namespace dhp {

class GradReducer {
 public:
  GradReducer(Model& model, OptimizerShard shard, Communicator& comm);

  // Before a step's first wave: the shard and the window emptied.
  void begin_step();
  // Before this rank's pass of a wave: the hook its backward pass reports progress to.
  GradsFinal pass();
  // After that pass: its sums completed.
  void pass_done();
  // A wave this rank has no pass in: the same sums, adding nothing.
  void no_pass();
  // After the last wave: the rest summed. Then held() holds this rank's block and the tail of
  // the step's summed gradients (CompactShard::held's layout).
  void finish();

  float* held() { return shard_.as<float>(); }
  const CompactShard& layout() const { return layout_; }
  // Bytes of the shard.
  int64_t bytes() const { return int64_t(shard_.bytes()); }

 private:
  // A sum in flight: window range `buf` holding gradient range [begin, end).
  struct Sum {
    float* buf;
    int64_t begin, end;
    std::vector<std::unique_ptr<PendingExchange>> parts;
  };
  void start(float* buf, int64_t begin, int64_t end);
  // Waits for the oldest sum, copies this rank's parts to the shard and empties its buffer.
  void settle();
  // Copies this rank's parts of layer l into its slot (the tail on rank 0 only).
  void preload(int l);
  void layer_done(int l);
  float* slot(int l) { return model_.grad_buffer() + window_.slot_at(l); }

  Model& model_;
  const LayerWindow& window_;
  CompactShard layout_;
  Communicator& comm_;
  Backend& backend_;
  DeviceBuffer shard_;      // (layout_.held_size()) fp32
  std::deque<Sum> sums_;    // in start order
  int next_ = -1;           // the next layer whose gradients complete (they complete from the last)
};

}  // namespace dhp
