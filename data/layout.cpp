#include "data/layout.h"

#include <algorithm>

#include "core/check.h"
#include "data/tokenizer.h"

namespace dhp {

int64_t full_length(const StoredLayout& s) {
  const int64_t markers = s.ids.markers() ? 2 : 0;
  int64_t L = s.ids.has_bos() ? 2 : 1;  // <bos> (when the tokenizer has one), <eos>
  for (int64_t t = 0; t < s.n; ++t)
    L += s.layout[t] >= 0 ? 1 : markers + s.image_grids[size_t(-s.layout[t] - 1)].tokens();
  return L;
}

std::vector<ImageSpan> image_spans(const StoredLayout& s) {
  std::vector<ImageSpan> spans(s.image_grids.size());
  const int64_t marker = s.ids.markers() ? 1 : 0;
  int64_t t = s.ids.has_bos() ? 1 : 0;  // after <bos>
  for (int64_t i = 0; i < s.n; ++i) {
    const int32_t v = s.layout[i];
    if (v >= 0) {
      ++t;
      continue;
    }
    const size_t k = size_t(-v - 1);
    spans[k] = {t + marker, s.image_grids[k].tokens()};  // after <img>, if any
    t += 2 * marker + s.image_grids[k].tokens();
  }
  return spans;
}

Sample expand_layout(const StoredLayout& s, int64_t begin, int64_t end,
                     const std::function<PreparedImage(int64_t)>& decode, int merge,
                     ImageLoad images, std::array<uint8_t, 3> blank_rgb) {
  const int64_t L = full_length(s);
  DHP_CHECK(begin >= 0 && begin <= end && end <= L,
            "token range [{}, {}) is outside the sample's {} tokens", begin, end, L);
  // Pass 1: where each image's tokens lie, to pick the images the range needs.
  const int64_t n_images = int64_t(s.image_grids.size());
  const std::vector<ImageSpan> spans = image_spans(s);
  int64_t k_first = n_images, k_last = -1;
  for (int64_t k = 0; k < n_images; ++k) {
    const int64_t a = spans[size_t(k)].first, b = a + spans[size_t(k)].tokens;
    if (begin < end && a < end && b > begin) k_first = std::min(k_first, k), k_last = std::max(k_last, k);
  }

  Sample out;
  out.begin = begin;
  out.full_length = L;
  out.first_image = k_first <= k_last ? int32_t(k_first) : 0;
  if (k_first <= k_last) out.first_image_token = std::max<int64_t>(0, begin - spans[size_t(k_first)].first);
  out.images_elsewhere = images == ImageLoad::Skip;
  for (int64_t k = k_first; k <= k_last && !out.images_elsewhere; ++k) {
    PreparedImage im = decode(k);
    const MergedGrid want = s.image_grids[size_t(k)];
    DHP_CHECK(im.grid_h / merge == want.rows && im.grid_w / merge == want.cols,
              "image {} decodes to {}x{} merged tokens ({}x{} patches) but its stored size gives {}x{}", k,
              im.grid_h / merge, im.grid_w / merge, im.grid_h, im.grid_w, want.rows, want.cols);
    if (images == ImageLoad::Blank) blank(im, blank_rgb);
    out.images.push_back(std::move(im));
  }

  // Pass 2: emit the tokens that fall in the range, and note the target after its end.
  const size_t cap = size_t(end - begin);
  out.tokens.reserve(cap);
  out.loss_mask.reserve(cap);
  out.image_of.reserve(cap);
  out.rope_pos.reserve(3 * cap);
  int64_t t = 0;
  int64_t m = 0;  // the M-RoPE count: token t's text position
  auto put = [&](int32_t tok, uint8_t loss, int32_t img) {
    if (t >= begin && t < end) {
      out.tokens.push_back(tok);
      out.loss_mask.push_back(loss);
      out.image_of.push_back(img);
      out.rope_pos.insert(out.rope_pos.end(), 3, int32_t(m));
    } else if (t == end) {
      out.next_target = loss ? tok : -1;
    }
    ++t;
    ++m;
  };
  const SpecialIds& ids = s.ids;
  if (ids.has_bos()) put(ids.bos, 0, -1);
  for (int64_t i = 0; i < s.n && t <= end; ++i) {
    const int32_t v = s.layout[i];
    if (v >= 0) {
      put(v, s.loss[i], -1);
      continue;
    }
    const int64_t k = -v - 1;
    const MergedGrid grid = s.image_grids[size_t(k)];
    const int64_t n = grid.tokens();
    if (ids.markers()) put(ids.img_begin, 0, -1);
    // Image tokens are emitted in one block, clipped to the range; they never carry loss, so
    // a range ending just before one keeps next_target = -1.
    const int64_t a = std::max(t, begin), b = std::min(t + n, end);
    if (a < b) {
      const int32_t rel = int32_t(k - k_first);
      out.tokens.insert(out.tokens.end(), size_t(b - a), ids.image_token());
      out.loss_mask.insert(out.loss_mask.end(), size_t(b - a), 0);
      out.image_of.insert(out.image_of.end(), size_t(b - a), rel);
      for (int64_t j = a - t; j < b - t; ++j)
        out.rope_pos.insert(out.rope_pos.end(), {int32_t(m), int32_t(m + j / grid.cols), int32_t(m + j % grid.cols)});
    }
    t += n;
    m += std::max(grid.rows, grid.cols);
    if (ids.markers()) put(ids.img_end, 0, -1);
  }
  put(ids.eos, 1, -1);
  DHP_ASSERT(int64_t(out.tokens.size()) == end - begin);
  return out;
}

Sample slice_sample(const Sample& full, int64_t begin, int64_t end) {
  const int64_t L = int64_t(full.tokens.size());
  DHP_CHECK(full.begin == 0 && begin >= 0 && begin <= end && end <= L,
            "slice [{}, {}) of a {}-token sample", begin, end, L);
  Sample out;
  out.id = full.id;
  out.begin = begin;
  out.full_length = L;
  out.next_target = end < L && full.loss_mask[size_t(end)] ? full.tokens[size_t(end)] : -1;
  int32_t k_first = -1, k_last = -1;
  for (int64_t t = begin; t < end; ++t) {
    const int32_t k = full.image_of[size_t(t)];
    if (k < 0) continue;
    if (k_first < 0) k_first = k;
    k_last = k;
  }
  if (k_first >= 0) {
    out.first_image = k_first;
    for (int64_t t = 0; t < begin; ++t) out.first_image_token += full.image_of[size_t(t)] == k_first;
    for (int32_t k = k_first; k <= k_last; ++k) out.images.push_back(full.images[size_t(k)]);
  }
  for (int64_t t = begin; t < end; ++t) {
    out.tokens.push_back(full.tokens[size_t(t)]);
    out.loss_mask.push_back(full.loss_mask[size_t(t)]);
    const int32_t k = full.image_of[size_t(t)];
    out.image_of.push_back(k < 0 ? -1 : k - k_first);
  }
  if (!full.rope_pos.empty())
    out.rope_pos.assign(full.rope_pos.begin() + 3 * begin, full.rope_pos.begin() + 3 * end);
  return out;
}

Sample placeholder_sample(int64_t id, int64_t begin, int64_t end, int64_t full_length,
                          int32_t pad) {
  Sample out;
  out.id = id;
  out.begin = begin;
  out.full_length = full_length;
  out.skipped = true;
  out.tokens.assign(size_t(end - begin), pad);
  out.loss_mask.assign(size_t(end - begin), 0);
  out.image_of.assign(size_t(end - begin), -1);
  return out;
}

}  // namespace dhp
