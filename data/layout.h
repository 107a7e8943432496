// From a stored layout (text tokens with one placeholder per image) to the tokens of a
// Sample, for the whole document or for a token range of it. Both datasets (JSONL and
// shards) store the same layout, so they share this expansion and produce the same samples.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "data/sample.h"
#include "data/tokenizer.h"
#include "types/image_span.h"
#include "types/image_geometry.h"

namespace dhp {

struct StoredLayout {
  const int32_t* layout = nullptr;  // (n) text ids; -(k+1) stands for image k
  const uint8_t* loss = nullptr;    // (n) 1 on answer tokens
  int64_t n = 0;
  std::vector<MergedGrid> image_grids;  // merged tokens of each image, predicted from its size
  SpecialIds ids;  // the tokenizer's table: bos, eos, pad, and the image markers if it has them
};

// Decoder tokens of the whole document: <bos> ... <eos> with n_k image tokens per image,
// between <img> and </img> when the table has markers.
int64_t full_length(const StoredLayout& s);

// Where each image's tokens lie in the document, in image order.
std::vector<ImageSpan> image_spans(const StoredLayout& s);

// Tokens [begin, end) of the document, with their M-RoPE positions (Sample::rope_pos).
// `decode(k)` is called only for the images whose image tokens overlap the range (none with
// ImageLoad::Skip); a decoded grid that disagrees with the predicted one throws dhp::Error (the
// stored size does not describe the stored pixels).
Sample expand_layout(const StoredLayout& s, int64_t begin, int64_t end,
                     const std::function<PreparedImage(int64_t)>& decode, int merge,
                     ImageLoad images, std::array<uint8_t, 3> blank_rgb = ImageGeometry{}.mean_rgb());

// Tokens [begin, end) cut out of an already loaded full sample, with the same conventions
// as expand_layout (images are the whole images whose tokens overlap the range).
Sample slice_sample(const Sample& full, int64_t begin, int64_t end);

// A sample whose data went bad: the same number of tokens (so every rank's plan and packs
// stay valid) but `pad` everywhere, no images and no loss, so it teaches nothing.
Sample placeholder_sample(int64_t id, int64_t begin, int64_t end, int64_t full_length,
                          int32_t pad);

}  // namespace dhp
