#include "model/device_batch.h"

#include <algorithm>

#include "core/check.h"

namespace dhp {

BatchUploader::BatchUploader(Backend& backend, const ModelConfig& cfg)
    : backend_(backend), cfg_(cfg), arena_(backend) {}

const DeviceBatch& BatchUploader::upload(const Batch& b) {
  const int64_t T = b.T, V = cfg_.vocab_size, m = cfg_.vision.merge;
  const int64_t pn = cfg_.vision.patch_numel(), P = b.n_patches(), N = P / (m * m);
  DHP_ASSERT(int64_t(b.tokens.size()) == T && int64_t(b.targets.size()) == T &&
             int64_t(b.doc.size()) == T && int64_t(b.pos.size()) == T &&
             int64_t(b.image_slot.size()) == T && int64_t(b.pixels.size()) == b.pixel_rows() * pn);
  DHP_ASSERT(b.rope_pos.empty() || int64_t(b.rope_pos.size()) == 3 * T);
  // M-RoPE's three positions a token; a batch without them (text made by hand, a generated
  // token) has each token's three equal to its pos.
  const bool mrope = cfg_.mrope();
  if (mrope && b.rope_pos.empty()) {
    rope_.resize(size_t(3 * T));
    for (int64_t t = 0; t < T; ++t) std::fill_n(rope_.begin() + 3 * t, 3, b.pos[size_t(t)]);
  }
  const std::vector<int32_t>& rope_host = b.rope_pos.empty() ? rope_ : b.rope_pos;

  ids_.resize(T);
  blk_.assign(T, -1);
  const int64_t R = b.image_rows >= 0 ? b.image_rows : N;
  slot_seen_.assign(R, 0);
  for (int64_t t = 0; t < T; ++t) {
    DHP_CHECK(b.tokens[t] < V && b.targets[t] < V,
              "token id {} at position {} is outside the model's vocabulary ({}): does "
              "model.vocab_size match the tokenizer?",
              std::max(b.tokens[t], b.targets[t]), t, V);
    const int32_t s = b.image_slot[t];
    DHP_ASSERT(s < R && (s < 0 || !slot_seen_[s]));
    if (s >= 0) slot_seen_[s] = 1;
    ids_[t] = s >= 0 ? -1 : b.tokens[t];
  }

  // Every image is its own document and one bidirectional block: it sees all of itself and
  // nothing else. The causal index is irrelevant under a full block; 0 keeps tiles tight.
  patch_image_.resize(P);
  patch_zero_.assign(P, 0);
  patch_row_.resize(P);
  patch_col_.resize(P);
  merge_.clear();
  for (size_t i = 0; i < b.images.size(); ++i) {
    const auto& im = b.images[i];
    DHP_ASSERT(im.grid_h % m == 0 && im.grid_w % m == 0);
    for (int r = 0; r < im.grid_h; ++r)
      for (int c = 0; c < im.grid_w; ++c) {
        const int64_t k = im.patch_offset + int64_t(r) * im.grid_w + c;
        patch_image_[k] = int32_t(i);
        patch_row_[k] = r;
        patch_col_[k] = c;
      }
    merge_.push_back(MergeImage{im.patch_offset, im.grid_h, im.grid_w});
  }
  // The stream of a tower that has one (TowerTraits::own_stream): a class row before each
  // image's patches where the tower has class rows.
  const TowerTraits& tower = cfg_.vision.traits();
  const bool cls = tower.class_row;
  const int64_t S = tower.own_stream() ? P + (cls ? int64_t(b.images.size()) : 0) : 0;
  stream_image_.resize(S);
  stream_zero_.assign(S, 0);
  stream_patch_.resize(S);
  pos_images_.clear();
  if (S > 0) {
    int64_t row = 0;
    for (size_t i = 0; i < b.images.size(); ++i) {
      const auto& im = b.images[i];
      pos_images_.push_back(PosImage{row, im.grid_h, im.grid_w});
      if (cls) {
        stream_image_[row] = int32_t(i);
        stream_patch_[row++] = -1;
      }
      for (int64_t k = 0; k < im.n_patches(); ++k) {
        stream_image_[row] = int32_t(i);
        stream_patch_[row++] = int32_t(im.patch_offset + k);
      }
    }
    DHP_ASSERT(row == S);
  }

  // What the tower's row and DeepStack read (DeviceBatch: patch_rope, frame_dup, image_slots,
  // stack_slot).
  const bool halves = tower.rope == TowerRope::grid_halves;
  patch_rope_.assign(halves ? size_t(3 * P) : 0, 0);
  for (int64_t k = 0; halves && k < P; ++k) {
    patch_rope_[size_t(3 * k + 1)] = patch_row_[size_t(k)];
    patch_rope_[size_t(3 * k + 2)] = patch_col_[size_t(k)];
  }
  // Each patch's frames: an image's one frame repeated, a frame pair's two.
  const int64_t frames = tower.temporal_patch;
  frame_dup_.resize(frames > 1 ? size_t(frames * P) : 0);
  int64_t pixel_row = 0;
  for (const auto& im : b.images) {
    DHP_CHECK(im.frames == 1 || im.frames == frames,
              "an image of {} frames: the {} tower embeds {} frame{} a patch", im.frames, tower.name, frames,
              frames > 1 ? "s" : "");
    for (int64_t k = 0; frames > 1 && k < im.n_patches(); ++k)
      for (int64_t f = 0; f < frames; ++f)
        frame_dup_[size_t((im.patch_offset + k) * frames + f)] =
            int32_t(pixel_row + (im.frames == 1 ? k : f * im.n_patches() + k));
    pixel_row += im.frames * im.n_patches();
  }
  const int64_t sets = cfg_.vision.image_sets();
  image_slots_.resize(sets > 1 ? size_t(sets * T) : 0);
  stack_slot_.resize(sets > 1 ? size_t(sets * N) : 0);
  for (int64_t k = 0; sets > 1 && k < sets; ++k) {
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = b.image_slot[size_t(t)];
      image_slots_[size_t(k * T + t)] = s < 0 ? -1 : int32_t(sets * s + k);
    }
    for (int64_t n = 0; n < N; ++n) stack_slot_[size_t(k * N + n)] = int32_t(sets * n + k);
  }

  DeviceBatch& d = db_;
  int32_t *ids, *targets, *doc, *pos, *blk, *slot, *rope = nullptr, *pimg, *pzero, *prow, *pcol;
  uint8_t* pixels;
  MergeImage* merge;
  int32_t *simg, *szero, *spatch;
  PosImage* pimgs;
  int32_t *prope, *fdup, *islots, *sslot;
  arena_.carve([&](Carver& c) {
    ids = c.take<int32_t>(T);        // (T)
    targets = c.take<int32_t>(T);    // (T)
    doc = c.take<int32_t>(T);        // (T)
    pos = c.take<int32_t>(T);        // (T)
    blk = c.take<int32_t>(T);        // (T)
    slot = c.take<int32_t>(T);       // (T)
    if (mrope) rope = c.take<int32_t>(3 * T);  // (T, 3)
    pixels = c.take<uint8_t>(int64_t(b.pixels.size()));  // (pixel rows, pn)
    pimg = c.take<int32_t>(P);       // (P)
    pzero = c.take<int32_t>(P);      // (P)
    prow = c.take<int32_t>(P);       // (P)
    pcol = c.take<int32_t>(P);       // (P)
    merge = c.take<MergeImage>(int64_t(merge_.size()));
    simg = c.take<int32_t>(S);       // (S)
    szero = c.take<int32_t>(S);      // (S)
    spatch = c.take<int32_t>(S);     // (S)
    pimgs = c.take<PosImage>(int64_t(pos_images_.size()));
    prope = c.take<int32_t>(int64_t(patch_rope_.size()));
    fdup = c.take<int32_t>(int64_t(frame_dup_.size()));
    islots = c.take<int32_t>(int64_t(image_slots_.size()));
    sslot = c.take<int32_t>(int64_t(stack_slot_.size()));
  });
  auto up = [&](auto* dst, const auto& src) {
    backend_.upload(dst, src.data(), sizeof(src[0]) * src.size());
  };
  up(ids, ids_);
  up(targets, b.targets);
  up(doc, b.doc);
  up(pos, b.pos);
  up(blk, blk_);
  up(slot, b.image_slot);
  if (mrope) up(rope, rope_host);
  up(pixels, b.pixels);
  up(pimg, patch_image_);
  up(pzero, patch_zero_);
  up(prow, patch_row_);
  up(pcol, patch_col_);
  up(merge, merge_);
  up(simg, stream_image_);
  up(szero, stream_zero_);
  up(spatch, stream_patch_);
  up(pimgs, pos_images_);
  up(prope, patch_rope_);
  up(fdup, frame_dup_);
  up(islots, image_slots_);
  up(sslot, stack_slot_);
  attention_runs(decoder_runs_, b.doc.data(), b.pos.data(), blk_.data(), T);
  attention_runs(vision_runs_, patch_image_.data(), patch_zero_.data(), patch_image_.data(), P);
  attention_runs(stream_runs_, stream_image_.data(), stream_zero_.data(), stream_image_.data(), S);
  auto view = [](const std::vector<AttnRun>& r) { return AttnRuns{r.data(), int64_t(r.size())}; };
  d = DeviceBatch{T, P, N, R, int(merge_.size()), b.loss_tokens(), ids, targets, doc, pos, blk,
                  slot, mrope ? rope : pos, pixels, pimg, pzero, prow, pcol, merge, S, simg, szero, spatch, pimgs,
                  view(decoder_runs_), view(vision_runs_), view(stream_runs_)};
  if (halves) d.patch_rope = prope;
  if (frames > 1) d.frame_dup = fdup;
  d.pixel_rows = b.pixel_rows();
  d.image_slots = sets > 1 ? islots : slot;
  if (sets > 1) d.stack_slot = sslot;
  return d;
}

}  // namespace dhp
