// The packed micro-batch the model consumes: one or more samples (documents) laid end to end.
// Every per-token array has length T (decoder tokens); image tokens occupy decoder positions
// whose token id is the pad id and whose image_slot points at the merged vision token.
#pragma once

#include <cstdint>
#include <vector>

namespace dhp {

// One image of the pack as the vision encoder sees it.
struct PackedImage {
  int64_t patch_offset = 0;  // first patch row of the encoder's patches of this image
  int grid_h = 0;            // patches per column (H' / p)
  int grid_w = 0;            // patches per row    (W' / p)
  // Frames: 1, or a temporal tower's temporal_patch (TowerTraits: a video's frames embedded
  // together, each patch over both). Batch::pixels holds them frame after frame.
  int frames = 1;
  int64_t n_patches() const { return int64_t(grid_h) * grid_w; }
};

struct Batch {
  int64_t T = 0;                      // decoder tokens in the pack
  std::vector<int32_t> tokens;        // (T) token ids; image positions hold <pad>
  std::vector<int32_t> targets;       // (T) token predicted from position t; -1 = no loss
  std::vector<int32_t> doc;           // (T) document (sample) index within the pack, 0..
  std::vector<int32_t> pos;           // (T) position within its document, from 0
  std::vector<int32_t> image_slot;    // (T) row of the merged image tokens, or -1 for text
  // (T, 3) each token's M-RoPE position, temporal, height and width (data/sample.h), which a
  // model with M-RoPE (model.mrope_section) turns by; empty: each token's three are its pos.
  std::vector<int32_t> rope_pos;
  // RGB pixels by patch, channel fastest: each image's frames (PackedImage::frames) in the
  // images' order, (pixel_rows(), p*p*3).
  std::vector<uint8_t> pixels;
  std::vector<PackedImage> images;    // images in order; merged tokens follow this order
  std::vector<int64_t> sample_ids;    // dataset index of each document of the pack
  // -1: image_slot numbers this pack's own merged tokens. Otherwise image_slot numbers the
  // rows of a buffer of this many image tokens that other ranks encode and send (a ring
  // group's images are each encoded on one rank), and `images` are the images this rank
  // encodes for the group, whoever holds their tokens.
  int64_t image_rows = -1;

  int64_t n_patches() const {
    int64_t n = 0;
    for (const auto& im : images) n += im.n_patches();
    return n;
  }
  int64_t pixel_rows() const {
    int64_t n = 0;
    for (const auto& im : images) n += im.frames * im.n_patches();
    return n;
  }
  int64_t loss_tokens() const {       // number of targets >= 0
    int64_t n = 0;
    for (int32_t t : targets) n += t >= 0;
    return n;
  }
};

}  // namespace dhp
