#include "data/pack.h"

#include <algorithm>

#include "core/check.h"

namespace dhp {

void append_image(Batch& b, const PreparedImage& im, const ImageGeometry& v) {
  const int64_t pn = v.patch_numel();
  DHP_ASSERT(int64_t(im.pixels.size()) == im.frames * im.n_patches() * pn);
  DHP_ASSERT(im.grid_h % v.merge == 0 && im.grid_w % v.merge == 0);
  DHP_ASSERT(im.tiles >= 1 && im.grid_h % im.tiles == 0);
  // Each tile is an image of the tower; their merged tokens follow one another.
  for (int t = 0; t < im.tiles; ++t) {
    PackedImage pi;
    pi.patch_offset = b.n_patches();
    pi.grid_h = im.grid_h / im.tiles;
    pi.grid_w = im.grid_w;
    pi.frames = im.frames;
    b.images.push_back(pi);
  }
  b.pixels.insert(b.pixels.end(), im.pixels.begin(), im.pixels.end());
}

Batch pack(const std::vector<const Sample*>& samples, const ImageGeometry& v) {
  Batch b;
  int64_t T = 0, P = 0;
  for (const Sample* s : samples) {
    DHP_ASSERT(s != nullptr);
    DHP_ASSERT(s->loss_mask.size() == s->tokens.size() && s->image_of.size() == s->tokens.size());
    T += int64_t(s->tokens.size());
    for (const auto& im : s->images) P += im.n_patches();
  }
  const int64_t pn = v.patch_numel();
  b.T = T;
  b.tokens.reserve(size_t(T));
  b.targets.reserve(size_t(T));
  b.doc.reserve(size_t(T));
  b.pos.reserve(size_t(T));
  b.image_slot.reserve(size_t(T));
  b.rope_pos.reserve(size_t(3 * T));
  b.pixels.reserve(size_t(P * pn));

  int64_t slot_base = 0;  // merged tokens of the images packed before this sample
  for (size_t d = 0; d < samples.size(); ++d) {
    const Sample& s = *samples[d];
    b.sample_ids.push_back(s.id);
    // First merged-token slot of each of this sample's images.
    std::vector<int64_t> first(s.images.size());
    for (size_t k = 0; k < s.images.size(); ++k) {
      const PreparedImage& im = s.images[k];
      append_image(b, im, v);
      first[k] = slot_base;
      slot_base += im.n_patches() / (int64_t(v.merge) * v.merge);
    }
    // Image tokens met so far, per image; a piece may start inside its first image.
    std::vector<int64_t> seen(s.images.size(), 0);
    if (!seen.empty()) seen[0] = s.first_image_token;
    const int64_t L = int64_t(s.tokens.size());
    DHP_ASSERT(s.rope_pos.empty() || int64_t(s.rope_pos.size()) == 3 * L);
    if (s.rope_pos.empty())
      for (int64_t t = 0; t < L; ++t) b.rope_pos.insert(b.rope_pos.end(), 3, int32_t(s.begin + t));
    else
      b.rope_pos.insert(b.rope_pos.end(), s.rope_pos.begin(), s.rope_pos.end());
    for (int64_t t = 0; t < L; ++t) {
      b.tokens.push_back(s.tokens[size_t(t)]);
      // The last token of a piece predicts the first token after it (next_target).
      const int32_t target = t + 1 < L ? (s.loss_mask[size_t(t + 1)] ? s.tokens[size_t(t + 1)] : -1)
                                       : s.next_target;
      b.targets.push_back(target);
      b.doc.push_back(int32_t(d));
      b.pos.push_back(int32_t(s.begin + t));  // RoPE positions count from the document start
      const int32_t k = s.image_of[size_t(t)];
      if (k < 0 || s.images_elsewhere) {
        b.image_slot.push_back(-1);
      } else {
        DHP_ASSERT(size_t(k) < s.images.size());
        b.image_slot.push_back(int32_t(first[size_t(k)] + seen[size_t(k)]++));
      }
    }
    // A whole document uses every merged token of its images once; a piece may stop early.
    if (s.images_elsewhere) continue;
    const bool whole = s.begin == 0 && (s.full_length == 0 || L == s.full_length);
    for (size_t k = 0; k < s.images.size(); ++k) {
      const int64_t n = s.images[k].n_patches() / (int64_t(v.merge) * v.merge);
      DHP_ASSERT(whole ? seen[k] == n : seen[k] <= n);
    }
  }
  return b;
}

}  // namespace dhp
