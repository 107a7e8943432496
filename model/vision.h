// The vision path (model-spec.md): patch embedding, bidirectional encoder blocks with 2-D
// RoPE, encoder norm, m x m merge and the GELU projector into the decoder's width.
// Images are encoded whole: the encoder's attention is always local (one image never sees
// another), whatever the decoder's attention is.
#pragma once

#include <cstdint>
#include <vector>

#include "model/attention.h"
#include "model/block.h"
#include "model/device_batch.h"
#include "types/model_config.h"

namespace dhp {

// The spec's pixel normalisation (types/image_geometry.h) as the op takes it.
PixelNorm pixel_norm();

class VisionPath {
 public:
  VisionPath(const ModelConfig& cfg, const Ops& ops);

  // Takes this pass's buffers for P patches and N merged tokens from the model's arena. With
  // encoder_grads false (the encoder frozen) backward stops at the projector: the encoder's
  // backward buffers are not taken.
  // `mode`: what the encoder's layers keep for backward (types/recompute.h).
  void carve(Carver& c, int64_t P, int64_t N, bool backward, bool encoder_grads = true,
             Recompute mode = Recompute::off);
  // Image tokens (N, d) of every image of the batch, in the batch's image order, into tokens().
  void forward(const ModelWeights& w, const DeviceBatch& b);
  // Reads the gradient of the image tokens from dtokens(); accumulates parameter gradients.
  void backward(const ModelWeights& w, const ModelParams& g, const DeviceBatch& b);
  CAct tokens() const { return tokens_; }
  Act dtokens() const { return dtokens_; }

 private:
  Act stream(int layer) const { return layer < int(acts_.size()) ? acts_[layer].x_in : x_final_; }
  const ModelConfig& cfg_;
  const Ops& ops_;
  BlockDims dims_;
  LocalAttention attn_;
  std::vector<BlockActs> acts_;  // per encoder layer
  BlockActs rebuilt_{};          // the buffers recompute rebuilds, shared by the layers
  Recompute mode_ = Recompute::off;  // of the last carve
  BlockScratch scratch_{};
  Act patches_;                  // (P, p·p·3) the normalised pixels in the storage dtype
  Act x_final_;                  // (P, dv) input of the encoder norm
  Act xn_;                       // (P, dv) normed, then its gradient
  float* rstd_ = nullptr;        // (P)
  Act merged_;                   // (N, m²·dv)
  Act f1_;                       // (N, d) projector hidden before GELU
  Act g1_;                       // (N, d) after GELU
  Act tokens_;                   // (N, d)
  Act dtokens_;                  // (N, d)
  Act dx_;                       // (P, dv) gradient of the encoder stream
  Act dmerged_;                  // (N, m²·dv)
  Act dg1_;                      // (N, d)
};

}  // namespace dhp
