#include "trainer/layer_gather.h"

#include <utility>

#include "core/check.h"

namespace dhp {

LayerGather::LayerGather(Model& model, Communicator& comm) : model_(model), comm_(comm) {
  DHP_ASSERT(model.weight_window().windowed() && model.master_shard().shard.world == comm.size() &&
             model.master_shard().shard.rank == comm.rank());
  model_.set_layer_feed(this);
}

LayerGather::~LayerGather() {
  // A gather still in flight writes into the model's slot: let it land first.
  for (Slot& s : slots_)
    if (s.pending) s.pending->wait();
  model_.set_layer_feed(nullptr);
}

int64_t LayerGather::bytes_per_gather() const {
  return model_.weight_window().slot * int64_t(dtype_size(model_.storage_dtype()));
}

bool LayerGather::holds(const Slot& s, int layer) const {
  return s.layer == layer && s.version == model_.weights_version();
}

void LayerGather::start(int layer) {
  Slot& s = slots_[layer % 2];
  if (s.pending) s.pending->wait();  // the slot's previous gather, done with by now
  const LayerWindow& weights = model_.weight_window();
  const LayerWindow& grads = model_.grad_window();
  const CompactShard& lay = model_.master_shard();
  const Model& m = std::as_const(model_);
  const Act slot = model_.working() + weights.slot_at(layer);
  const int64_t begin = grads.layer[size_t(layer)], end = grads.layer[size_t(layer) + 1];
  const int64_t bytes = (end - begin) * int64_t(dtype_size(slot.t));
  Backend& backend = model_.backend();
  backend.zero(slot.p, size_t(bytes));
  lay.for_each_held(begin, end, [&](const CompactShard::Range& h, int64_t a, int64_t b) {
    if (h.begin == lay.tail_begin() && comm_.rank() != 0) return;  // every rank holds the tail
    backend.ops().cast(slot + (a - begin), m.master() + h.local + (a - h.begin), b - a);
  });
  DHP_ASSERT(bytes % 4 == 0);
  if (comm_.overlapping_collectives())
    s.pending = comm_.start_all_reduce(slot.p, bytes / 4, DataType::I32, ReduceOp::Sum);
  else
    comm_.all_reduce(slot.p, bytes / 4, DataType::I32, ReduceOp::Sum);
  s.layer = layer;
  s.version = model_.weights_version();
  ++gathers_;
}

void LayerGather::need(int layer, bool backward) {
  Slot& s = slots_[layer % 2];
  if (!holds(s, layer)) start(layer);
  if (s.pending) {
    s.pending->wait();
    s.pending.reset();
  }
  // The layer asked for next goes into the other slot, whose layer this pass is done with
  // (forward: the one before; backward: the one after). After the forward's last layer the
  // backward's first is the same layer.
  const int next = backward ? layer - 1 : layer + 1;
  if (next >= 0 && next < model_.config().layers && !holds(slots_[next % 2], next)) start(next);
}

}  // namespace dhp
