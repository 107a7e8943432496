// Memory model of design.md §2.2: bytes one rank needs to run its share of a group.
//
//   static (types/state_bytes.h: fp32 master weights of every parameter and their working
//   copy in the storage dtype, fp32 gradients and moments of the trainable ones, the moments
//   / N under ZeRO-1, and the master / N too where there is a working copy: frozen groups
//   hold neither gradients nor moments)
//   + decoder activations per token held (what the mode of parallel.recompute keeps: every
//     layer's kept buffers, plus one set of the buffers it rebuilds; model/block.h) (a rank of a ring of degree c holds at most
//     ceil(L/c) tokens of a sequence of L: zigzag split, plan.h)
//   + vision activations per patch of the images the rank encodes (per encoder row of a
//     clip/siglip tower: a clip image's class row counts as a patch): images are never split,
//     they are dealt longest-first to the least loaded rank by patch count (balance_images),
//     and the rank with the most patches is the one that counts
//   + logits buffer: min(tokens, chunk) x vocab, its gradient in place
//   + ring buffers on rings of degree > 1 (double-buffered K/V and dK/dV blocks, per decoder
//     token, and the routed image rows)
//   + an eighth of all those (the arenas' headroom) + workspace.
// Every term mirrors a buffer the engine carves, so the prediction is compared with the
// backend's measured high-water mark (Backend::peak_bytes; tests/test_memory_model.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "parallel/cost_model.h"
#include "types/model_config.h"
#include "types/param_group.h"
#include "types/recompute.h"
#include "types/state_bytes.h"

namespace dhp {

// The most memory per device the planner accepts, in GiB (a PiB): beyond it byte counts
// would overflow.
inline constexpr double kMaxMemoryGb = double(int64_t(1) << 20);

// The activation bytes a rank carves in each of its arenas for one pass: the model's
// (activations, logits, backward scratch, batch), a ring's (K/V blocks, accumulators, the
// members' metadata) and the image exchange's. Each arena keeps the largest pass it has run,
// so a rank running several passes holds every arena's largest (ArenaBytes::max).
struct ArenaBytes {
  int64_t model = 0, ring = 0, exchange = 0;
  ArenaBytes max(const ArenaBytes& o) const {
    return {std::max(model, o.model), std::max(ring, o.ring), std::max(exchange, o.exchange)};
  }
};

// What the engine that runs the plans holds, where the planner knows it (a training run): the
// bytes of its storage dtype (train.precision) and its parameter table's totals, every tensor
// aligned as its arenas are (model/params.h). Zeros: the profile's dtype, and the counts from
// the model's shape without the alignment (at most 15 elements a tensor).
struct EngineLayout {
  int storage_bytes = 0;
  int64_t params = 0, trainable = 0;
  int64_t grad_window = 0;  // elements of ZeRO-2's gradient window (model/layer_window.h)
  int64_t weight_window = 0;  // elements of ZeRO-3's working-weight window
};

class MemoryModel {
 public:
  MemoryModel(const ModelConfig& model, const DeviceProfile& device, int world, double memory_gb,
              int zero, Recompute recompute = Recompute::off, const ParamGroups& groups = {},
              const EngineLayout& engine = {});

  int64_t capacity() const { return capacity_; }
  int64_t parameters() const { return params_; }
  int64_t trainable_parameters() const { return trainable_; }
  // Parameters of one group (model-spec.md's table).
  int64_t group_parameters(ParamGroup g) const { return group_params_[size_t(g)]; }
  // Of static_bytes() (types/state_bytes.h): the gradients, and the moments this rank holds;
  // state() has every part.
  int64_t gradient_bytes() const { return state_.gradients; }
  int64_t optimizer_bytes() const { return state_.moments; }
  const StateBytes& state() const { return state_; }
  // Elements of ZeRO-2's gradient window (model/layer_window.h), whatever the stage.
  int64_t gradient_window() const { return grad_window_; }
  // Elements of ZeRO-3's working-weight window, whatever the stage.
  int64_t weight_window() const { return weight_window_; }
  // Bytes of one ZeRO-3 gather of a decoder layer (0 below stage 3).
  int64_t layer_gather_bytes() const { return gather_bytes_; }
  int64_t static_bytes() const { return static_; }
  // Over every arena (a ring's and the image exchange's counted on one rank too):
  int64_t bytes_per_token() const { return per_token_ + 2 * routed_per_token_ + ring_per_token_; }
  int64_t bytes_per_patch() const { return per_patch_ + sent_per_patch_; }  // before the merge

  // Activation bytes of the whole of s on one rank (decoder tokens and all its images).
  int64_t one_rank_bytes(const SeqShape& s) const;
  // A whole rank: activations already summed over its sequences, `tokens` decoder tokens.
  int64_t rank_bytes(int64_t activations, int64_t tokens) const;
  // The most any rank of a ring of degree c needs for these sequences run together.
  int64_t group_bytes(std::span<const SeqShape* const> seqs, int c) const;
  // The most patches one rank of c encodes for these sequences.
  int64_t max_rank_patches(std::span<const SeqShape* const> seqs, int c) const;
  // The same for image classes already sorted largest first with distinct patch counts.
  static int64_t max_rank_patches(std::span<const ImageClass> sorted, int c);
  // The bytes of a rank holding `tokens` decoder tokens and encoding `patches` patches, on a
  // ring of degree c.
  int64_t bytes_for(int64_t tokens, int64_t patches, int c = 1) const;
  // The arenas a rank carves for one pass, exactly as the engine does (ring buffers only on a
  // ring; group_tokens: every token of the ring's sequences, for its members' metadata). The
  // planner fits with bytes_for/group_bytes, which count the ring's buffers on one rank too,
  // so they are never below held_bytes of these.
  ArenaBytes arenas_for(int64_t tokens, int64_t patches, int c, int64_t group_tokens) const;
  // The arenas of the fullest rank of a ring of degree c running these sequences together.
  ArenaBytes group_arenas(std::span<const SeqShape* const> seqs, int c) const;
  // What a rank holds with these arenas: static state, the arenas (their eighth of headroom
  // included: kernels/backend.h), and the workspace.
  int64_t held_bytes(const ArenaBytes& a) const;
  // The most tokens a text-only sample may have to fit on one rank alone (no ring); 0 when
  // not even one token does.
  int64_t longest_text_tokens() const;
  // The smallest ring degree <= max_degree at which the sequences fit; max_degree + 1 if none.
  int min_degree(std::span<const SeqShape* const> seqs, int max_degree) const;
  // One sequence alone.
  int64_t group_bytes(const SeqShape& s, int c) const {
    const SeqShape* p = &s;
    return group_bytes(std::span<const SeqShape* const>(&p, 1), c);
  }
  int min_degree(const SeqShape& s, int max_degree) const {
    const SeqShape* p = &s;
    return min_degree(std::span<const SeqShape* const>(&p, 1), max_degree);
  }
  int merge2() const { return m2_; }
  // Encoder rows per image beyond its patches (a clip tower's class row): the "patches" this
  // model counts are encoder rows (image_classes' extra).
  int extra_rows() const { return extra_rows_; }

 private:
  int64_t capacity_, params_, trainable_, grad_window_, weight_window_ = 0, gather_bytes_ = 0, static_, per_token_, per_patch_, logits_per_token_, fixed_;
  int64_t ring_per_token_, routed_per_token_, sent_per_patch_;
  StateBytes state_;
  int64_t group_params_[kParamGroups];
  int64_t logits_chunk_;
  int m2_;
  int extra_rows_ = 0;
};

}  // namespace dhp
