// The model's shape, exactly the names of model-spec.md's [model] and [model.vision] sections.
#pragma once

#include <cstdint>
#include <string>

#include "types/image_geometry.h"

namespace dhp {

// The image geometry (patch, merge, min_pixels, max_pixels) plus the encoder's shape.
struct VisionConfig : ImageGeometry {
  int dim = 64;              // dv
  int layers = 1;            // encoder layers; 0 = patch embedding, norm and projector only
  int heads = 4;             // vheads; head dim = dim / heads
  int ffn = 128;             // vffn: SwiGLU hidden size

  int head_dim() const { return dim / heads; }
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
  // Names added by dhp beyond model-spec.md (docs/pretrained.md), for Hugging Face decoders:
  bool attention_bias = false;   // q/k/v projections of the decoder carry biases (Qwen2)
  double rms_norm_eps = 1e-6;    // eps of the decoder's RMSNorms; the vision encoder keeps 1e-6
  // A Hugging Face folder the decoder starts from (trainer/hf_checkpoint.h): its config.json
  // sets the decoder's shape, its tensors the decoder's weights. "" = none.
  std::string init;
  VisionConfig vision;

  int hd() const { return head_dim > 0 ? head_dim : dim / heads; }
  int q_dim() const { return heads * hd(); }
  int kv_dim() const { return kv_heads * hd(); }
};

}  // namespace dhp
