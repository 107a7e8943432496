// ZeRO-3 (parallel.zero = 3): no rank holds the working weights of every decoder layer. Each
// rank keeps the fp32 master of its ZeRO block (model/shard.h), and the decoder layers' working
// weights share two slots (model/layer_window.h); before a pass reads layer l, its weights are
// gathered into slot l mod 2 from the ranks whose blocks hold its parts, and the layer the pass
// asks for next is gathered into the other slot while this one computes. A forward pass asks
// for layers 0 .. L-1, its backward for L-1 .. 0: the two layers the forward ended with are
// still there, so a training pass gathers 2L - 2 layers.
//
// A gather starts from what this rank holds: it rounds its part of the layer's master (its
// block's, and the tail of the partition, which every rank holds) into place; then each other
// rank whose block holds a part of the layer broadcasts it from its own rounding. A layer spans
// one or two blocks at small worlds, W·layer/n at large ones; every rank receives the layer
// once, what an all-gather moves, and the bits are the owner's rounding, exact in fp32 and bf16
// alike. The master keeps ZeRO-1's partition (model/shard.h): no layer-by-rank slicing, so a
// checkpoint and a resume are those of every other stage.
//
// The gathers are collectives of every rank, started in the order the passes ask for layers.
// Under DHP a rank runs a pass in some waves and none in others, so every rank takes part in
// every wave (trainer/executor.h): where it has no micro-batch it asks for the same layers in
// the same order (Model::skip_pass). What a slot holds is the same on every rank, so all
// ranks gather the same layers. A slot is stale once the weights change (the optimizer's
// update, a checkpoint's load: Model::weights_version).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace dhp {

// Gradient-layout range [begin, end) of the trainable weights, rounded from the fp32 master
// into `dst` (range element i at dst + i) in the storage dtype on every rank: this rank's part
// rounded in place, every other owner's part broadcast from it. `pending` null: the broadcasts
// complete before the return; otherwise they are started (the communicator overlaps
// collectives) and appended to it. Every rank calls it with the same range.
void gather_master(const Model& model, Communicator& comm, Act dst, int64_t begin, int64_t end,
                   std::vector<std::unique_ptr<PendingExchange>>* pending);

class LayerGather : public LayerFeed {
 public:
  // Installs itself as `model`'s feed until destroyed; `comm` spans the ranks of the model's
  // master shard.
  LayerGather(Model& model, Communicator& comm);
  ~LayerGather() override;
  LayerGather(const LayerGather&) = delete;
  LayerGather& operator=(const LayerGather&) = delete;

  void need(int layer, bool backward) override;

 private:
  struct Slot {
    int layer = -1;
    uint64_t version = 0;  // the model's weights_version() it was gathered at
    std::vector<std::unique_ptr<PendingExchange>> pending;
  };
  void settle(Slot& s);
  bool holds(const Slot& s, int layer) const;
  void start(int layer);

  Model& model_;
  Communicator& comm_;
  Slot slots_[2];
};

}  // namespace dhp
