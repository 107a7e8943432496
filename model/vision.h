// The vision path (model-spec.md): patch embedding, bidirectional encoder blocks, m x m merge
// and the GELU projector into the decoder's width; what the tower is comes from its row of
// types/architecture.h. The native tower: 2-D RoPE blocks on the patches, then a final norm.
// The Hugging Face towers (clip, siglip; docs/vision_towers.md) run on an encoder stream of
// their own (per image: a class row where the row has one, then its patches): the patch
// embedding scattered into the stream, the class row and bicubically resized positions
// (vision_embed), a pre-norm, the LayerNorm/GELU blocks up to feature_layer, the class rows
// dropped, then the same merge and projector.
// Qwen3-VL's tower (qwen3_vl) runs on its patches as its stream, each patch embedded over two
// frames (an image's one, repeated), with resized learned positions and 2-D RoPE by halves;
// its merger's LayerNorm is the final norm, its two Linears the projector (hidden m²·dv); and
// each DeepStack layer's hidden state goes through a merger of its own into a further set of
// image tokens, which the decoder adds to its stream after its first layers.
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

// The tower's pixel normalisation (model.vision.pixel_mean, pixel_std) as the op takes it.
PixelNorm pixel_norm(const VisionConfig& v);
// The kernels' GeluKind of a config activation.
GeluKind gelu_kind(VisionAct a);
GeluKind gelu_kind(ProjectorAct a);
// The kernels' PosResize of a tower's position resize.
PosResize pos_resize(PositionResize r);

class VisionPath {
 public:
  VisionPath(const ModelConfig& cfg, const Ops& ops);

  // Takes this pass's buffers for P patches, an encoder stream of S rows (DeviceBatch::S; 0
  // for a tower without a stream of its own) and N merged tokens from the model's arena. With encoder_grads
  // false (the encoder frozen) backward stops at the projector: the encoder's backward
  // buffers are not taken.
  // `mode`: what the encoder's layers keep for backward (types/recompute.h).
  void carve(Carver& c, int64_t P, int64_t S, int64_t N, bool backward, bool encoder_grads = true,
             Recompute mode = Recompute::off);
  // Image tokens (N, sets·d) of every image of the batch, in the batch's image order, into
  // tokens(): per merged token the projector's d values, then each DeepStack merger's
  // (VisionConfig::image_sets; DeviceBatch::stack_slot).
  void forward(const ModelWeights& w, const DeviceBatch& b);
  // Reads the gradient of the image tokens from dtokens(); accumulates parameter gradients.
  void backward(const ModelWeights& w, const ModelParams& g, const DeviceBatch& b);
  CAct tokens() const { return tokens_; }
  Act dtokens() const { return dtokens_; }

 private:
  // The encoder up to its features (P, dv): features() afterwards; and its transpose from
  // d(features) in dfeat_.
  void encode(const ModelWeights& w, const DeviceBatch& b);
  void encode_backward(const ModelWeights& w, const ModelParams& g, const DeviceBatch& b);
  Act features() const;
  // The top of the encoder: its final norm's output, else the last stream row set.
  Act top() const;
  Act stream(int layer) const { return layer < int(acts_.size()) ? acts_[layer].x_in : x_final_; }
  // One projector (the main one or a DeepStack merger's): Linear, GELU, Linear.
  struct Projector {
    Act in;      // (N, m²·dv) its input: the merged features (a DeepStack merger's: normed)
    Act f1, g1;  // (N, hidden) before and after the GELU
    Act out;     // (N, d)
  };
  // A DeepStack merger's own buffers beside its projector's.
  struct Deepstack {
    Act merged;               // (N, m²·dv) the layer's hidden state merged
    float* mean = nullptr;    // (N) its LayerNorm's statistics
    float* rstd = nullptr;
    Projector proj;           // in = the LayerNorm's output
  };
  Projector carve_projector(Carver& c, int64_t N, Act in, Act out);
  void projector_forward(CAct fc1_w, CAct fc1_b, CAct fc2_w, CAct fc2_b, const Projector& p, int64_t N);
  // From d(out) in dout to d(in) in din (none when null), parameter gradients accumulated.
  void projector_backward(CAct fc1_w, CAct fc2_w, float* g_fc1_w, float* g_fc1_b, float* g_fc2_w, float* g_fc2_b,
                          const Projector& p, CAct dout, Act din, int64_t N);
  // DeepStack merger j's backward from its output's gradient (in dset_) to its parameters and,
  // when the encoder trains, to d(hidden state) in ddeep_.
  void deepstack_backward(const ModelWeights& w, const ModelParams& g, const DeviceBatch& b, size_t j,
                          bool encoder);
  const ModelConfig& cfg_;
  const Ops& ops_;
  BlockDims dims_;
  int layers_run_;               // encoder layers the pass runs (pretrained: up to feature_layer)
  LocalAttention attn_;
  std::vector<BlockActs> acts_;  // per encoder layer that runs
  BlockActs rebuilt_{};          // the buffers recompute rebuilds, shared by the layers
  Recompute mode_ = Recompute::off;  // of the last carve
  BlockScratch scratch_{};
  // Rows: P patches; S the encoder stream (DeviceBatch::S, the patches where the tower has no
  // stream of its own); N merged tokens. Each optional buffer is there where the row's trait
  // (named) is.
  Act patches_;                  // (P, temporal_patch·p·p·3) the embedding's input, storage dtype
  Act frame_;                    // temporal_patch > 1: (pixel rows, p·p·3) the normalised frames
  Act patch_emb_;                // class_row: (P, dv) the patch embedding, then scattered
  Act embed_;                    // pre_norm: (S, dv) the embeddings before the pre-norm
  float* pre_mean_ = nullptr;    // pre_norm: (S)
  float* pre_rstd_ = nullptr;    // pre_norm: (S)
  Act x_final_;                  // (S, dv) the stream after the last layer that runs
  Act normed_;                   // final_norm: (S, dv) its output; in backward its gradient
  float* norm_mean_ = nullptr;   // final_norm, LayerNorm: (S)
  float* norm_rstd_ = nullptr;   // final_norm: (S)
  Act feat_;                     // class_row: (P, dv) the features without class rows
  Act merged_;                   // (N, m²·dv)
  Act proj_normed_;              // projector_norm: (N, m²·dv) merged_ normed, the projector's input
  float* proj_mean_ = nullptr;   // projector_norm: (N)
  float* proj_rstd_ = nullptr;   // projector_norm: (N)
  Projector proj_;               // in = merged_ (or its norm); out = tokens_ with one token set
  std::vector<Deepstack> deep_;  // per model.vision.deepstack layer
  Act tokens_;                   // (N, sets·d)
  Act dtokens_;                  // (N, sets·d)
  Act dset_;                     // sets > 1: (N, d) the gradient of one token set
  Act ddeep_;                    // DeepStack: (P, dv) d(hidden state) from one merger
  Act dnormed_;                  // DeepStack, projector_norm: (N, m²·dv) d(a LayerNorm's output)
  Act dx_;                       // (S, dv) gradient of the encoder stream
  Act dfeat_;                    // (P, dv) gradient of the features; class_row: then of the
                                 // patch embedding
  Act dembed_;                   // pre_norm: (S, dv) gradient of the embeddings
  Act dmerged_;                  // (N, m²·dv)
  Act dg1_;                      // (N, hidden)
};

}  // namespace dhp
