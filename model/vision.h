// The vision path (model-spec.md): patch embedding, bidirectional encoder blocks with 2-D
// RoPE, encoder norm, m x m merge and the GELU projector into the decoder's width.
// Images are encoded whole: the encoder's attention is always local (one image never sees
// another), whatever the decoder's attention is.
#pragma once

#include <cstdint>
#include <vector>

#include "model/block.h"
#include "model/config.h"
#include "model/device_batch.h"

namespace dhp {

class VisionPath {
 public:
  VisionPath(const ModelConfig& cfg, const Ops& ops);

  // Takes this pass's buffers for P patches and N merged tokens from the model's arena.
  void carve(Carver& c, int64_t P, int64_t N, bool backward);
  // Image tokens (N, d) of every image of the batch, in the batch's image order, into tokens().
  void forward(const ModelParams& p, const DeviceBatch& b);
  // Reads the gradient of the image tokens from dtokens(); accumulates parameter gradients.
  void backward(const ModelParams& p, const ModelParams& g, const DeviceBatch& b);
  const float* tokens() const { return tokens_; }
  float* dtokens() const { return dtokens_; }

 private:
  float* stream(int layer) const { return layer < int(acts_.size()) ? acts_[layer].x_in : x_final_; }
  const ModelConfig& cfg_;
  const Ops& ops_;
  BlockDims dims_;
  LocalAttention attn_;
  std::vector<BlockActs> acts_;  // per encoder layer
  BlockScratch scratch_{};
  float* x_final_ = nullptr;     // (P, dv) input of the encoder norm
  float* xn_ = nullptr;          // (P, dv) normed, then its gradient
  float* rstd_ = nullptr;        // (P)
  float* merged_ = nullptr;      // (N, m²·dv)
  float* f1_ = nullptr;          // (N, d) projector hidden before GELU
  float* g1_ = nullptr;          // (N, d) after GELU
  float* tokens_ = nullptr;      // (N, d)
  float* dtokens_ = nullptr;     // (N, d)
  float* dx_ = nullptr;          // (P, dv) gradient of the encoder stream
  float* dmerged_ = nullptr;     // (N, m²·dv)
  float* dg1_ = nullptr;         // (N, d)
};

}  // namespace dhp
