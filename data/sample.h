// A sample as the model's packing sees it: tokens, loss mask, which image each image token
// belongs to, and the decoded images. Loaded by a Dataset (data/dataset.h), packed by pack().
#pragma once

#include <cstdint>
#include <vector>

#include "data/image.h"
#include "types/image_span.h"

namespace dhp {

// One document in model-spec.md's layout, or a token range [begin, begin + tokens.size()) of
// it (a piece: the plan may give a rank only part of a long sequence):
//   <bos> human text ... <img> [image tokens] </img> ... gpt answer <eos>
// (the markers only when the tokenizer's table has them; data/chat_template.h for the text)
struct Sample {
  int64_t id = 0;                      // dataset index
  std::vector<int32_t> tokens;         // (L) token ids; image tokens hold the pad id
  std::vector<uint8_t> loss_mask;      // (L) 1 on answer tokens and the final <eos>
  std::vector<int32_t> image_of;       // (L) index into `images` for image tokens, -1 on text
  // (L, 3) each token's M-RoPE position (temporal, height, width), as Qwen2-VL's get_rope_index
  // gives them for the whole document: a text token's three are equal and count on from the
  // document's start; an image's tokens share its start as temporal position, and add their
  // row and column among its merged tokens; after an image the count goes on from its start
  // plus the larger of its rows and columns. Empty: the text rule (begin + t) for every token.
  std::vector<int32_t> rope_pos;
  std::vector<PreparedImage> images;   // whole images whose tokens the piece holds, in order
  int64_t begin = 0;                   // position of tokens[0] in the full document
  int64_t full_length = 0;             // tokens of the full document
  int32_t first_image = 0;             // index of images[0] among the document's images
  int64_t first_image_token = 0;       // merged tokens of images[0] that lie before `begin`
  int32_t next_target = -1;            // the document's token at begin + L when it carries
                                       // loss (the last token's target), else -1
  bool skipped = false;                // its data went bad: placeholder_sample() in layout.h
  bool images_elsewhere = false;       // loaded with ImageLoad::Skip: image tokens are placed,
                                       // `images` is empty (another rank encodes them)
};

// What a load does with the images whose tokens overlap the range.
enum class ImageLoad {
  Decode,  // decode them into Sample::images
  Blank,   // decode them, then zero the pixels (evaluation without images)
  Skip,    // leave them out: the range's image tokens come from another rank's encoder
};

}  // namespace dhp
