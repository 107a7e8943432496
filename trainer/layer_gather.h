// ZeRO-3 (parallel.zero = 3): no rank holds the working weights of every decoder layer. Each
// rank keeps the fp32 master of its ZeRO block (model/shard.h), and the decoder layers' working
// weights share two slots (model/layer_window.h); before a pass reads layer l, its weights are
// gathered into slot l mod 2 from the ranks whose blocks hold its parts, and the layer the pass
// asks for next is gathered into the other slot while this one computes. A forward pass asks
// for layers 0 .. L-1, its backward for L-1 .. 0: the two layers the forward ended with are
// still there, so a training pass gathers 2L - 2 layers.
//
// A gather is a sum of disjoint parts: every rank zeroes the slot, rounds what it holds of the
// layer's master into its place (the tail of the partition, which every rank holds, from rank
// 0 alone), and the slot is all-reduced. Each bit of the result comes from one rank at most,
// so the slot is summed as 32-bit integers, where adding zeros changes no bit: exact in fp32
// and in bf16 alike (communicators sum no bf16), every value's sign of zero kept. An
// all-reduce moves twice an all-gather's bytes; it needs no layer-by-rank partition of the
// master, which ZeRO-1 and 2 share, and so resumes across stages without re-slicing.
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

#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace dhp {

class LayerGather : public LayerFeed {
 public:
  // Installs itself as `model`'s feed until destroyed; `comm` spans the ranks of the model's
  // master shard.
  LayerGather(Model& model, Communicator& comm);
  ~LayerGather() override;
  LayerGather(const LayerGather&) = delete;
  LayerGather& operator=(const LayerGather&) = delete;

  void need(int layer, bool backward) override;
  // Layers gathered so far.
  int64_t gathers() const { return gathers_; }
  // Bytes one gather sums over the ranks.
  int64_t bytes_per_gather() const;

 private:
  struct Slot {
    int layer = -1;
    uint64_t version = 0;  // the model's weights_version() it was gathered at
    std::unique_ptr<PendingExchange> pending;
  };
  bool holds(const Slot& s, int layer) const;
  void start(int layer);

  Model& model_;
  Communicator& comm_;
  Slot slots_[2];
  int64_t gathers_ = 0;
};

}  // namespace dhp
