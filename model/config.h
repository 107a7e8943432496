// The model's shape, exactly the names of model-spec.md's [model] and [model.vision] sections.
#pragma once

#include <cstdint>

namespace dhp {

struct VisionConfig {
  int patch = 14;            // p: patch side in pixels
  int dim = 64;              // dv
  int layers = 1;            // encoder layers; 0 = patch embedding, norm and projector only
  int heads = 4;             // vheads; head dim = dim / heads
  int ffn = 128;             // vffn: SwiGLU hidden size
  int merge = 2;             // m in {1, 2}
  int64_t min_pixels = 16 * 16;
  int64_t max_pixels = 256 * 256;

  int head_dim() const { return dim / heads; }
  int factor() const { return patch * merge; }  // f = p * m: resized sides are multiples of it
  int64_t patch_numel() const { return int64_t(patch) * patch * 3; }
};

struct ModelConfig {
  int dim = 128;        // d
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 0;     // 0 = dim / heads
  int ffn = 256;
  int vocab_size = 512;
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  VisionConfig vision;

  int hd() const { return head_dim > 0 ? head_dim : dim / heads; }
  int q_dim() const { return heads * hd(); }
  int kv_dim() const { return kv_heads * hd(); }
};

}  // namespace dhp
