// Seeded synthetic *length* distributions for planning and benchmarks (and, later, for
// `dhp data synth`): per sample the decoder text tokens, the images with their resized pixel
// sizes and decoder tokens, and the loss tokens. No pixels are produced here.
//
// The presets imitate public mixtures: `captions` (short, one image, gentle spread), `mixed`
// (captions plus documents, multi-image and a little video), `video-longtail` (most samples
// short, a few video / document samples 10-100x longer, as in video and document datasets).
// A sample depends only on (seed, id), so sample 17 is the same whether 20 or 20000 are drawn.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dhp {

struct SyntheticImage {
  int height = 0;       // resized pixels, a multiple of the merge factor f = patch * merge
  int width = 0;        // (a tiled preset's: the image's own size, tiled as InternVL tiles it)
  int64_t tokens = 0;   // decoder tokens: (height / f) * (width / f), or all its tiles'
  int tiles = 1;        // images of the tower it becomes (InternVL's tiles and thumbnail)
};

struct SyntheticSample {
  int64_t id = 0;
  int64_t text_tokens = 0;     // every non-image decoder token, markers included
  int64_t vision_tokens = 0;   // sum of images[].tokens
  int64_t loss_tokens = 0;     // tokens the model predicts (<= text_tokens)
  std::vector<SyntheticImage> images;
  int64_t tokens() const { return text_tokens + vision_tokens; }
  int32_t tower_images() const {  // the tower's images: each tile counts
    int32_t n = 0;
    for (const SyntheticImage& im : images) n += im.tiles;
    return n;
  }
};

// Kinds of sample a preset mixes; weights need not sum to one.
struct PresetParams {
  std::string name;
  double caption_weight = 1.0;      // one image, short caption
  double document_weight = 0.0;     // one high-resolution image, longer answer
  double multi_image_weight = 0.0;  // 2..max_images images
  double video_weight = 0.0;        // many frames, Pareto-distributed count
  double text_weight = 0.0;         // text only
  int caption_side = 392;           // median short side (pixels) of a caption image
  int document_side = 1036;         // median short side of a document image
  int max_images = 6;
  int min_frames = 8;               // video frame count: min_frames * U^(-1/video_alpha)
  int max_frames = 64;
  double video_alpha = 1.5;         // smaller = heavier tail
  int64_t max_image_tokens = 4096;  // per image, like a max_pixels setting
  int64_t max_tokens = 65536;       // a sample is cut (frames dropped, text shortened) to this
  // InternVL's dynamic tiling (tile_side > 0): each image's own size, aspect ratios spread
  // widely (documents, charts, panoramas), becomes the tiles InternVL cuts (types/image_geometry.h:
  // up to max_tiles tiles of tile_side, a thumbnail when more than one; several images of a
  // sample share max_tiles, as InternVL's multi-image data does), each (tile_side / f)² tokens.
  int tile_side = 0;
  int max_tiles = 12;
};

// Known names: "captions", "mixed", "video-longtail", "internvl-tiles" (InternVL3's fine-tuning
// mixture: captions, documents and multi-image samples in 448 px tiles, 1-13 tiles of 256
// tokens an image). Throws std::invalid_argument otherwise.
PresetParams preset_params(const std::string& name);
std::vector<std::string> preset_names();

// Sample `id` of the preset; `factor` is the model's patch * merge (28 for p = 14, m = 2).
SyntheticSample preset_sample(const PresetParams& p, int64_t id, uint64_t seed, int factor);

// Samples first_id .. first_id + count - 1.
std::vector<SyntheticSample> preset_samples(const PresetParams& p, int64_t first_id, int64_t count,
                                            uint64_t seed, int factor);

}  // namespace dhp
