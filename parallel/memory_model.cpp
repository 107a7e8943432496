#include "parallel/memory_model.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "parallel/config.h"
#include "types/state_bytes.h"

namespace dhp {

MemoryModel::MemoryModel(const ModelConfig& m, const DeviceProfile& dev, int world, double memory_gb,
                         int zero, Recompute recompute, const ParamGroups& groups, const EngineLayout& engine) {
  DHP_CHECK(world >= 1, "the world size must be at least 1, got {}", world);
  DHP_CHECK(std::isfinite(memory_gb) && memory_gb > 0 && memory_gb <= kMaxMemoryGb,
            "memory per device (parallel.memory_gb) = {} GiB: it must be a positive number of GiB, at most {}",
            memory_gb, kMaxMemoryGb);
  capacity_ = int64_t(memory_gb * double(int64_t(1) << 30));
  const auto& v = m.vision;
  const int64_t d = m.dim, q = m.q_dim(), kv = m.kv_dim(), dv = v.dim;
  m2_ = v.merge * v.merge;
  // Parameter count of model-spec.md's table, by group (types/param_group.h).
  auto& n = group_params_;
  const TowerTraits& tower = v.traits();
  const int64_t qkv_bias = m.attention_bias ? q + 2 * kv : 0;  // model.attention_bias
  const int64_t o_bias = m.attention_out_bias ? d : 0;         // model.attention_out_bias
  const int64_t qk_norm = m.qk_norm ? 2 * int64_t(m.hd()) : 0;  // model.qk_norm
  const int64_t layer = block_params(NormKind::rms, MlpKind::swiglu, false, d, q, kv, m.ffn) + qkv_bias + o_bias + qk_norm;
  n[size_t(ParamGroup::Language)] = int64_t(m.layers) * layer + d;
  n[size_t(ParamGroup::Embeddings)] = int64_t(m.vocab_size) * d * (m.tie_embeddings ? 1 : 2);
  // model/params.cpp's tower table from its row (types/architecture.h): every layer of a
  // checkpoint, run or not, and what it holds beside them.
  const int64_t norm_params = tower.norm == NormKind::layer ? 2 * dv : dv;
  const int64_t vision_layer = block_params(tower.norm, tower.mlp, tower.block_biases, dv, dv, dv, v.ffn) -
                               (tower.block_biases && !tower.qkv_bias ? 3 * dv : 0) + (tower.qk_norm ? 2 * dv : 0) +
                               (tower.layer_scale ? 2 * dv : 0);
  const int64_t vision = v.embed_numel() * dv + (tower.patch_bias ? dv : 0) + (tower.class_row ? dv : 0) +
                         (tower.learned_positions ? v.pos_rows() * dv : 0) +
                         (tower.pre_norm ? 2 * dv : 0) + (tower.final_norm ? norm_params : 0) +
                         int64_t(v.layers) * vision_layer;
  // What a checkpoint's tower holds and never runs (the layers after feature_layer, its
  // post_layernorm and pooling head): parameters, but no gradient or moments.
  int64_t held_parts = 0;
  if (tower.feature_layer && v.post_norm) held_parts += 2 * dv;
  if (tower.pool_head && v.pool_head) held_parts += dv + 4 * dv * dv + 4 * dv + 2 * dv + 2 * dv * v.ffn + v.ffn + dv;
  const int64_t held = int64_t(v.layers - v.layers_run()) * vision_layer + held_parts;
  n[size_t(ParamGroup::Vision)] = vision + held_parts;
  extra_rows_ = extra_image_rows(m);
  // The projector, and each DeepStack merger: the same behind a LayerNorm of the merged rows.
  const int64_t md = v.merged_dim(), ph = v.projector_hidden(d), sets = v.image_sets();
  const int64_t projector = md * ph + ph + ph * d + d;
  n[size_t(ParamGroup::Projector)] = projector + (sets - 1) * (2 * md + projector) + (tower.projector_norm ? 2 * md : 0);
  params_ = trainable_ = 0;
  for (size_t g = 0; g < kParamGroups; ++g) {
    params_ += n[g];
    if (groups.group[g].trainable) trainable_ += n[g] - (g == size_t(ParamGroup::Vision) ? held : 0);
  }
  // The engine's own layout (types/state_bytes.h): fp32 master weights, the working copy in
  // the storage dtype, fp32 gradients of the trainable parameters, their moments (a ZeRO-1
  // block and the remainder; the master sharded alike beside a working copy); under ZeRO-2 the
  // gradient window (all but the decoder layers, and two of those) and the summed block.
  const bool table = engine.params > 0;
  const bool windowed = m.layers >= 3 && groups.trainable(ParamGroup::Language);
  grad_window_ = table && engine.grad_window > 0 ? engine.grad_window
                 : windowed                      ? trainable_ - int64_t(m.layers - 2) * layer
                                                 : trainable_;
  // Under ZeRO-3 the working weights alike: the weights outside the layers, and two layers.
  weight_window_ = table && engine.weight_window > 0 ? engine.weight_window
                   : windowed                        ? params_ - int64_t(m.layers - 2) * layer
                                                     : params_;
  DHP_CHECK(zero >= 0 && zero <= kMaxZero, "parallel.zero = {}: the ZeRO stage is 0 to {}", zero, kMaxZero);
  const bool gathers = zero >= 3 && world > 1 && windowed;
  gather_bytes_ = gathers ? layer * dev.act_bytes : 0;
  state_ = state_bytes(table ? engine.params : params_, table ? engine.trainable : trainable_, dev.act_bytes,
                       zero >= 1 ? world : 1, zero >= 2 ? grad_window_ : 0, gathers ? weight_window_ : 0);
  static_ = state_.total();
  // Per token, what a block of width c, ffn f, q/kv widths qw/kvw and h query heads holds for
  // backward (model/block.cpp): the layer input; the two norm outputs and the SwiGLU product
  // (rebuilt under selective and full); q, k, v, the attention output, the residual and the
  // two SwiGLU inputs (rebuilt under full); fp32 statistics: two rstd and h lse per token.
  // `extra`: bytes per token the decoder's model.qk_norm adds to what full recompute rebuilds
  // (q and k before their norms and one fp32 rstd per head), or a tower's whole-width q/k
  // norms (one rstd each).
  // Kept buffers count once per layer, rebuilt ones once per pass; the backward scratch
  // shared by the layers (BlockScratch) once.
  const int64_t act = dev.act_bytes;
  // A LayerNorm block keeps a mean beside each rstd; a GELU MLP one input (fc1's output)
  // instead of SwiGLU's two, and its scratch has no second MLP gradient.
  auto layers_bytes = [&](int64_t layers, int64_t c, int64_t f, int64_t qw, int64_t kvw, int64_t h,
                          NormKind norm, MlpKind mlp, int64_t extra = 0) {
    const int64_t mlp_inputs = mlp == MlpKind::swiglu ? 2 : 1;
    const int64_t norms = 2 * c * act + (norm == NormKind::layer ? 4 : 2) * 4, swiglu = f * act;
    const int64_t linears = (2 * qw + 2 * kvw + c + mlp_inputs * f) * act + h * 4 + extra;
    const int64_t input = c * act;
    const int64_t scratch = ((mlp_inputs + 1) * f + 2 * c + 2 * qw + 2 * kvw) * act;
    switch (recompute) {
      case Recompute::off: return layers * (input + norms + swiglu + linears) + scratch;
      case Recompute::selective: return layers * (input + linears) + norms + swiglu + scratch;
      case Recompute::full: return layers * input + norms + swiglu + linears + scratch;
    }
    return int64_t(0);
  };
  // Decoder, per token (model/model.cpp): the layers; the final norm's input, output and
  // their gradients and the stream's gradient (4 d) and its rstd; the batch's six int32
  // columns (model/device_batch.cpp), nine under M-RoPE.
  const int64_t qk_norm_bytes = m.qk_norm ? (q + kv) * act + int64_t(m.heads + m.kv_heads) * 4 : 0;
  // With DeepStack, one set's rows for the add and an int32 column per set.
  per_token_ = layers_bytes(m.layers, d, m.ffn, q, kv, m.heads, NormKind::rms, MlpKind::swiglu, qk_norm_bytes) +
               4 * d * act + 4 + (m.mrope() ? 9 : 6) * 4 + (sets > 1 ? d * act + sets * 4 : 0);
  // Vision (model/vision.cpp), per row of the encoder stream (the patches, or the tower's own
  // stream: a class row of an image is priced as a patch row, image_classes counting it): the
  // normalised pixels; the layers that run; the stream after them and its gradient, the merged
  // rows and their gradient (m² rows make one); with class rows the patch embedding, the
  // features without class rows and their gradient; with a pre-norm the embeddings before it
  // and their gradient, and its two statistics; with a final norm its output and statistics;
  // per merged token, the projector's hidden before and after its GELU and that one's
  // gradient, the image tokens and their gradient (every set); with projector_norm its
  // LayerNorm's output and statistics; with DeepStack the main projector's output and one
  // set's gradient apart, each merger's merged rows, LayerNorm output and statistics, hidden
  // pair and output; with either, one shared d(LayerNorm output); per
  // patch one shared d(hidden state). A patch over several frames keeps its frames beside its
  // input (room for a frame pair's two). The batch: pixels (one byte a value, a frame pair's
  // two frames), four int32 columns per patch, three per row
  // of a stream of its own, three for RoPE by halves, one per frame, one per set and merged
  // token.
  const int64_t K = sets - 1, frames = tower.temporal_patch;
  const int64_t rows = 4 + (tower.class_row ? 3 : 0) + (tower.pre_norm ? 2 : 0) + (tower.final_norm ? 1 : 0) +
                       (K > 0 ? 1 : 0);
  const int64_t stats = (tower.pre_norm ? 2 * 4 : 0) +
                        (tower.final_norm ? (tower.norm == NormKind::layer ? 2 : 1) * 4 : 0);
  const int64_t pnorm = tower.projector_norm ? 1 : 0;
  const int64_t per_merged = (3 * ph + 2 * sets * d + (K > 0 ? 2 * d : 0) + (K > 0 || pnorm ? md : 0) + pnorm * md +
                              K * (2 * md + 2 * ph + d)) * act +
                             (K + pnorm) * 8 + (K > 0 ? sets * 4 : 0);
  const int64_t columns = 4 + (tower.own_stream() ? 3 : 0) + (tower.rope == TowerRope::grid_halves ? 3 : 0) +
                          (frames > 1 ? frames : 0);
  per_patch_ = (v.embed_numel() + (frames > 1 ? v.embed_numel() : 0)) * act +
               layers_bytes(v.layers_run(), dv, v.ffn, dv, dv, v.heads, tower.norm, tower.mlp,
                            tower.qk_norm ? 2 * dv * act + 2 * 4 : 0) + rows * dv * act +
               stats + (per_merged + m2_ - 1) / m2_ + v.embed_numel() + columns * 4;
  // A ring of degree c > 1 carves, per token of the rank: in the ring's work arena
  // (parallel/ring_attention.cpp, the larger backward set) two K/V blocks in flight, their
  // fp32 dK/dV accumulators, dQ's fp32 sum and one block's dQ, dK, dV parts; in its metadata
  // arena three int32 columns per token of every other member (not priced: arenas_for); the
  // routed image rows'
  // gradient in the model's arena; the routed rows themselves in the image exchange's arena
  // (parallel/image_exchange.cpp), which also sends the merged tokens this rank encodes.
  ring_per_token_ = (4 * kv + q + 2 * kv) * act + (4 * kv + q) * 4;
  routed_per_token_ = sets * d * act;
  sent_per_patch_ = (sets * d * act + 4 + m2_ - 1) / m2_;
  // Logits, one chunk at a time: (rows, V) in the storage dtype (the gradient overwrites
  // them) and an fp32 lse per row.
  logits_per_token_ = int64_t(m.vocab_size) * act + 4;
  // Arenas keep an eighth above the largest pass they have carved (kernels/backend.h): every
  // carved term is priced with it, so sums of per-sequence bytes stay exact.
  for (int64_t* b : {&per_token_, &per_patch_, &ring_per_token_, &routed_per_token_, &sent_per_patch_,
                     &logits_per_token_})
    *b += (*b + 7) / 8;
  logits_chunk_ = std::max<int64_t>(1, dev.logits_chunk);
  fixed_ = dev.workspace_bytes;
}

namespace {
// a·b + c·d, saturated far below overflow (a group that large never fits anyway).
int64_t sat(int64_t a, int64_t b, int64_t c, int64_t d) {
  constexpr int64_t kHuge = int64_t(1) << 61;
  const double x = double(a) * double(b) + double(c) * double(d);
  return x >= double(kHuge) ? kHuge : a * b + c * d;
}
}  // namespace

int64_t MemoryModel::one_rank_bytes(const SeqShape& s) const {
  const int64_t rows = s.vision_tokens * m2_ + (s.vision_tokens > 0 ? s.images * extra_rows_ : 0);
  return sat(s.tokens(), bytes_per_token(), rows, bytes_per_patch());
}

int64_t MemoryModel::longest_text_tokens() const {
  // Bytes grow with the tokens: a binary search.
  int64_t lo = 0, hi = kMaxSampleTokens;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (group_bytes(SeqShape{0, mid, 0, 0}, 1) <= capacity_) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

int64_t MemoryModel::rank_bytes(int64_t activations, int64_t tokens) const {
  return static_ + activations + std::min(tokens, logits_chunk_) * logits_per_token_ + fixed_;
}

int64_t MemoryModel::max_rank_patches(std::span<const ImageClass> sorted, int c) {
  if (sorted.empty()) return 0;
  if (c == 1 || (sorted.size() == 1 && sorted[0].count == 1)) {
    int64_t total = 0;
    for (const auto& im : sorted) total += im.patches * im.count;
    return total;
  }
  if (sorted.size() == 1) return (sorted[0].count + c - 1) / c * sorted[0].patches;
  thread_local std::vector<ImageLevel> levels;
  balance_images(sorted, c, levels);
  return levels.back().patches;
}

int64_t MemoryModel::max_rank_patches(std::span<const SeqShape* const> seqs, int c) const {
  thread_local std::vector<ImageClass> classes;
  classes.clear();
  for (const SeqShape* s : seqs) {
    ImageClass im[2];
    const int k = image_classes(*s, m2_, im, extra_rows_);
    for (int i = 0; i < k; ++i) classes.push_back(im[i]);
  }
  merge_image_classes(classes);
  return max_rank_patches(std::span<const ImageClass>(classes), c);
}

ArenaBytes MemoryModel::arenas_for(int64_t tokens, int64_t patches, int c, int64_t group_tokens) const {
  ArenaBytes a;
  const int64_t routed = c > 1 ? routed_per_token_ : 0;
  a.model = sat(tokens, per_token_ + routed, patches, per_patch_) +
            std::min(tokens, logits_chunk_) * logits_per_token_;
  if (c > 1) {
    // The other members' metadata: 3 int32 per token, with the arena's eighth.
    a.ring = sat(tokens, ring_per_token_, std::max<int64_t>(0, group_tokens - tokens), 14);
    a.exchange = sat(tokens, routed_per_token_, patches, sent_per_patch_);
  }
  return a;
}

int64_t MemoryModel::held_bytes(const ArenaBytes& a) const {
  return static_ + a.model + a.ring + a.exchange + fixed_;
}

int64_t MemoryModel::bytes_for(int64_t tokens, int64_t patches, int) const {
  // What the planner fits: the ring's buffers are counted on one rank too (where none is
  // carved), so that bytes never grow with the degree and a group's bytes are the sum of its
  // sequences', which the planner's searches rely on. The ring's copy of the other members'
  // metadata (12 bytes per token of the group, under 0.1% of a token's activations) is
  // covered by the ring buffers so counted.
  return rank_bytes(sat(tokens, bytes_per_token(), patches, bytes_per_patch()), tokens);
}

ArenaBytes MemoryModel::group_arenas(std::span<const SeqShape* const> seqs, int c) const {
  int64_t tokens = 0, all = 0;
  for (const SeqShape* s : seqs) tokens += (s->tokens() + c - 1) / c, all += s->tokens();
  return arenas_for(tokens, max_rank_patches(seqs, c), c, all);
}

int64_t MemoryModel::group_bytes(std::span<const SeqShape* const> seqs, int c) const {
  int64_t tokens = 0;
  for (const SeqShape* s : seqs) tokens += (s->tokens() + c - 1) / c;
  return bytes_for(tokens, max_rank_patches(seqs, c), c);
}

int MemoryModel::min_degree(std::span<const SeqShape* const> seqs, int max_degree) const {
  if (group_bytes(seqs, max_degree) > capacity_) return max_degree + 1;
  int lo = 1, hi = max_degree;  // bytes never grow with the degree: binary search
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (group_bytes(seqs, mid) <= capacity_) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

}  // namespace dhp
