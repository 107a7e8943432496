// Where a model keeps a layout of its decoder layers that no rank holds whole.
//
// Whole: one buffer of the layout. Windowed: the decoder layers, which hold nearly all of a
// large model's parameters, share two slots of one layer each, layer l living in slot l mod 2;
// everything else (the vision tower, projector, embeddings, final norm and head) keeps its
// place in the "rest". Two layouts are windowed this way:
//  - the fp32 gradients (ZeRO-2 and 3, parallel.zero >= 2): a layer's gradients are complete as
//    soon as the backward pass has left it, so they are summed onto their owners
//    (trainer/grad_reducer.h) while the next layer computes, and its slot is free again for the
//    layer after that;
//  - the working weights (ZeRO-3): a layer's weights are gathered from the ranks that own its
//    fp32 master into its slot before a pass reads them (trainer/layer_gather.h), the next
//    layer's while this one computes.
//
// Buffer layout: the rest ([0, first) then [last, n) of the layout), then the two slots. The
// decoder layers are contiguous in both layouts (model/params.cpp's table order: tower,
// projector, token embedding, layers, final norm, head) and all of one size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/params.h"

namespace dhp {

struct LayerWindow {
  int64_t n = 0;               // elements of the layout
  std::vector<int64_t> layer;  // windowed: layer l is [layer[l], layer[l + 1]); empty: whole
  int64_t slot = 0;            // elements of one slot: the largest layer

  bool windowed() const { return !layer.empty(); }
  int layers() const { return windowed() ? int(layer.size()) - 1 : 0; }
  int64_t first() const { return windowed() ? layer.front() : 0; }
  int64_t last() const { return windowed() ? layer.back() : 0; }
  int64_t rest() const { return n - (last() - first()); }
  // Elements of the buffer.
  int64_t elements() const { return rest() + 2 * slot; }
  // Buffer offset of layer l's slot.
  int64_t slot_at(int l) const { return rest() + (l % 2) * slot; }
  // Whether layout offset o is in a decoder layer (it has a place only while its slot holds it).
  bool in_layers(int64_t o) const { return o >= first() && o < last(); }
  // Buffer offset of layout offset o: in the rest, or in its layer's slot.
  int64_t at(int64_t o) const {
    if (o < first()) return o;
    if (o >= last()) return o - (last() - first());
    const int l = int(std::upper_bound(layer.begin(), layer.end(), o) - layer.begin()) - 1;
    return slot_at(l) + (o - layer[size_t(l)]);
  }
  // Calls f(layout offset, buffer offset, count) for each piece of [begin, end) in the rest.
  template <class F>
  void for_each_in_rest(int64_t begin, int64_t end, F&& f) const {
    if (const int64_t b = std::min(end, first()); begin < b) f(begin, begin, b - begin);
    if (const int64_t a = std::max(begin, last()); a < end) f(a, at(a), end - a);
  }

  static LayerWindow whole(int64_t n) { return LayerWindow{n, {}, 0}; }
  // The window over `table`'s decoder layers in the gradient layout (grads) or the weight
  // arena's (weights): whole where they do not train (their gradients need no window, and their
  // weights have no master to gather from) or there are fewer than three (two slots hold them
  // all).
  static LayerWindow of_grads(const ParamTable& table, int layers) { return of(table, layers, true); }
  static LayerWindow of_weights(const ParamTable& table, int layers) { return of(table, layers, false); }

 private:
  static LayerWindow of(const ParamTable& table, int layers, bool grads) {
    LayerWindow w = whole(grads ? table.trainable_total() : table.total());
    if (layers < 3 || !table.get("layers.0.attn_norm.weight").trainable) return w;
    const auto at = [&](const std::string& name) {
      const ParamSpec& p = table.get(name);
      return grads ? p.grad_offset : p.offset;
    };
    for (int l = 0; l < layers; ++l) w.layer.push_back(at("layers." + std::to_string(l) + ".attn_norm.weight"));
    w.layer.push_back(at("final_norm.weight"));
    for (int l = 0; l < layers; ++l) w.slot = std::max(w.slot, w.layer[size_t(l) + 1] - w.layer[size_t(l)]);
    return w;
  }
};

}  // namespace dhp
