// Where a model keeps its fp32 gradients. Whole: one arena of the gradient layout
// (ParamSpec::grad_offset). Windowed (ZeRO-2, parallel.zero = 2): the decoder layers, which
// hold nearly all of a large model's parameters, share two slots of one layer each, layer l
// writing into slot l mod 2; everything else (the vision tower, projector, embeddings, final
// norm and head) keeps its place in the "rest". A layer's gradients are complete as soon as
// the backward pass has left it, so they are summed onto their owners (trainer/grad_reducer.h)
// while the next layer computes, and its slot is free again for the layer after that.
//
// Buffer layout: the rest ([0, first) then [last, n) of the gradient layout), then the two
// slots. The decoder layers are contiguous in the gradient layout (model/params.cpp's table
// order: tower, projector, token embedding, layers, final norm, head) and all of one size.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "model/params.h"

namespace dhp {

struct GradWindow {
  int64_t n = 0;               // elements of the gradient layout
  std::vector<int64_t> layer;  // windowed: layer l's gradients are [layer[l], layer[l + 1]); empty: whole
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
  // Buffer offset of gradient offset o.
  int64_t at(int64_t o) const {
    if (o < first()) return o;
    if (o >= last()) return o - (last() - first());
    const int l = int(std::upper_bound(layer.begin(), layer.end(), o) - layer.begin()) - 1;
    return slot_at(l) + (o - layer[size_t(l)]);
  }

  static GradWindow whole(int64_t n) { return GradWindow{n, {}, 0}; }
  // ZeRO-2's window over `table`'s decoder layers: whole where they do not train (nothing to
  // window) or there are fewer than three (two slots hold them all).
  static GradWindow of(const ParamTable& table, int layers) {
    GradWindow w = whole(table.trainable_total());
    if (layers < 3 || !table.get("layers.0.attn_norm.weight").trainable) return w;
    for (int l = 0; l < layers; ++l) w.layer.push_back(table.get("layers." + std::to_string(l) + ".attn_norm.weight").grad_offset);
    w.layer.push_back(table.get("final_norm.weight").grad_offset);
    for (int l = 0; l < layers; ++l) w.slot = std::max(w.slot, w.layer[size_t(l) + 1] - w.layer[size_t(l)]);
    return w;
  }
};

}  // namespace dhp
