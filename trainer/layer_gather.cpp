#include "trainer/layer_gather.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "core/check.h"

namespace dhp {

void gather_master(const Model& model, Communicator& comm, Act dst, int64_t begin, int64_t end,
                   std::vector<std::unique_ptr<PendingExchange>>* pending) {
  const CompactShard& lay = model.master_shard();
  const Ops& ops = model.backend().ops();
  lay.for_each_held(begin, end, [&](const CompactShard::Range& h, int64_t a, int64_t b) {
    ops.cast(dst + (a - begin), model.master() + h.local + (a - h.begin), b - a);
  });
  const DataType type = data_type_of(dst.t);
  lay.for_each_block(begin, end, [&](int owner, int64_t a, int64_t b) {
    // The owner's rounding, in place above, is what the others receive.
    void* at = (dst + (a - begin)).p;
    if (pending) pending->push_back(comm.start_broadcast(at, b - a, type, owner));
    else comm.broadcast(at, b - a, type, owner);
  });
}

LayerGather::LayerGather(Model& model, Communicator& comm) : model_(model), comm_(comm) {
  DHP_ASSERT(model.weight_window().windowed() && model.master_shard().shard.world == comm.size() &&
             model.master_shard().shard.rank == comm.rank());
  model_.set_layer_feed(this);
}

LayerGather::~LayerGather() {
  // A gather still in flight writes into the model's slot: let it land first, but never wait
  // on a peer that may be gone while an error unwinds (the exchanges' own destructors decide).
  if (std::uncaught_exceptions() == 0) {
    try {
      for (Slot& s : slots_) settle(s);
    } catch (const Error&) {
    }
  }
  model_.set_layer_feed(nullptr);
}

void LayerGather::settle(Slot& s) {
  for (auto& p : s.pending) p->wait();
  s.pending.clear();
}

bool LayerGather::holds(const Slot& s, int layer) const {
  return s.layer == layer && s.version == model_.weights_version();
}

void LayerGather::start(int layer) {
  Slot& s = slots_[layer % 2];
  settle(s);  // the slot's previous gather, done with by now
  const LayerWindow& grads = model_.grad_window();
  const Act slot = model_.working() + model_.weight_window().slot_at(layer);
  gather_master(model_, comm_, slot, grads.layer[size_t(layer)], grads.layer[size_t(layer) + 1],
                comm_.overlapping_collectives() ? &s.pending : nullptr);
  s.layer = layer;
  s.version = model_.weights_version();
}

void LayerGather::need(int layer, bool backward) {
  Slot& s = slots_[layer % 2];
  if (!holds(s, layer)) start(layer);
  settle(s);
  // The layer asked for next goes into the other slot, whose layer this pass is done with
  // (forward: the one before; backward: the one after). After the forward's last layer the
  // backward's first is the same layer.
  const int next = backward ? layer - 1 : layer + 1;
  if (next >= 0 && next < model_.config().layers && !holds(slots_[next % 2], next)) start(next);
}

}  // namespace dhp
