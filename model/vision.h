// The vision path (model-spec.md): patch embedding, bidirectional encoder blocks with 2-D
// RoPE, encoder norm, m x m merge and the GELU projector into the decoder's width.
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch.h"
#include "model/block.h"
#include "model/config.h"

namespace dhp {

class VisionPath {
 public:
  VisionPath(const ModelConfig& cfg, const Ops& ops);

  // Image tokens (N, d) of every image of the batch, in the batch's image order.
  // Keeps activations for backward(); call again for the next micro-batch.
  const std::vector<float>& forward(const ModelParams& p, const Batch& b);
  // dtokens (N, d): gradient of the image tokens. Accumulates parameter gradients.
  void backward(const ModelParams& p, const ModelParams& g, const Batch& b,
                const std::vector<float>& dtokens, BlockScratch& scratch);
  int64_t n_tokens() const { return n_tokens_; }

 private:
  const ModelConfig& cfg_;
  const Ops& ops_;
  BlockDims dims_;
  int64_t n_patches_ = 0, n_tokens_ = 0;
  std::vector<int32_t> doc_, idx_, row_, col_;   // (P) mask and RoPE metadata per patch
  std::vector<MergeImage> merge_images_;
  std::vector<BlockActs> acts_;                  // per encoder layer
  std::vector<float> x_;                         // (P, dv) encoder stream / its gradient
  std::vector<float> x_final_;                   // (P, dv) input of the encoder norm
  std::vector<float> xn_, rstd_;                 // (P, dv), (P)
  std::vector<float> merged_;                    // (N, m²·dv)
  std::vector<float> f1_, g1_;                   // (N, d) projector hidden before/after GELU
  std::vector<float> tokens_;                    // (N, d)
  std::vector<float> dmerged_, dg1_;             // gradients, (N, m²·dv) and (N, d)
};

}  // namespace dhp
