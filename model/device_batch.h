// A packed micro-batch in device memory (data/batch.h is its host layout), uploaded once per
// micro-step together with the attention, RoPE and merge metadata the model needs, so the
// model itself runs no host loop over tokens or patches.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/attention_runs.h"
#include "kernels/backend.h"
#include "types/batch.h"
#include "types/model_config.h"

namespace dhp {

struct DeviceBatch {
  int64_t T = 0;            // decoder tokens
  int64_t P = 0;            // patches
  int64_t N = 0;            // merged image tokens (P / m²) this pack encodes
  int64_t R = 0;            // image token rows image_slot indexes: N, or Batch::image_rows
  int n_images = 0;
  int64_t loss_tokens = 0;  // targets >= 0 (host count)
  // Decoder, (T) each.
  const int32_t* ids = nullptr;         // token ids, -1 where an image token sits
  const int32_t* targets = nullptr;     // next token to predict, -1 = no loss
  const int32_t* doc = nullptr;         // document within the pack
  const int32_t* pos = nullptr;         // position in its document: RoPE and causal order
  const int32_t* blk = nullptr;         // -1 (no bidirectional block in the decoder)
  const int32_t* image_slot = nullptr;  // row of the merged image tokens, or -1
  const int32_t* rope = nullptr;        // the decoder's RoPE positions: pos, or under M-RoPE
                                        // (model.mrope_section) Batch::rope_pos, (T, 3)
  // Vision encoder.
  const uint8_t* pixels = nullptr;      // (P, p·p·3) RGB, normalised by the vision path
  const int32_t* patch_image = nullptr; // (P) image index: the encoder's doc and block
  const int32_t* patch_zero = nullptr;  // (P) zeros: the causal index, unused under a block
  const int32_t* patch_row = nullptr;   // (P) grid row, for 2-D RoPE
  const int32_t* patch_col = nullptr;   // (P) grid column
  const MergeImage* merge = nullptr;    // (n_images)
  // The encoder stream of a tower that has one (TowerTraits::own_stream): per image, its class
  // row (where the tower has one) then its patches row-major, images back to back; S = P +
  // n_images with class rows, P otherwise; 0 for a tower whose stream is its patches.
  int64_t S = 0;
  const int32_t* stream_image = nullptr;  // (S) image index: the encoder's doc and block
  const int32_t* stream_zero = nullptr;   // (S) zeros
  const int32_t* stream_patch = nullptr;  // (S) patch row of each stream row, -1 = class row
  const PosImage* pos_images = nullptr;   // (n_images) first stream row and grid of each image

  // The runs of each metadata on the host (kernels/attention_runs.h).
  AttnRuns decoder_runs, vision_runs, stream_runs;

  // Where the tower's row asks for them (null otherwise):
  // TowerRope::grid_halves: (P, 3) each patch's (0, row, column), RoPE positions by axis.
  const int32_t* patch_rope = nullptr;
  // temporal_patch > 1: (temporal·P) the pixel row each frame of each patch of the patch
  // embedding's input reads (an image's one frame repeated, a frame pair's own two).
  const int32_t* frame_dup = nullptr;
  int64_t pixel_rows = 0;  // rows of `pixels`: P, more with frame pairs
  // The image token sets (VisionConfig::image_sets(), k = 0 the projector's, then one per
  // DeepStack layer) travel as one row of sets·d per merged token: image_slots (sets, T) gives,
  // for set k, the row of that (R·sets, d) view each position takes (-1 for text), and
  // stack_slot (sets, N) the row each merged token of set k fills. With one set, image_slots
  // is image_slot and stack_slot is null.
  const int32_t* image_slots = nullptr;
  const int32_t* stack_slot = nullptr;

  AttnMeta decoder_meta() const { return {doc, pos, blk, decoder_runs}; }
  AttnMeta vision_meta() const { return {patch_image, patch_zero, patch_image, vision_runs}; }
  // Each image with its class row is one bidirectional block of the stream.
  AttnMeta stream_meta() const { return {stream_image, stream_zero, stream_image, stream_runs}; }
};

// Owns the device memory of uploaded batches (one arena, reused: no allocation once the
// largest batch has been seen) and checks each batch against the model on the way.
class BatchUploader {
 public:
  BatchUploader(Backend& backend, const ModelConfig& cfg);
  // Pointers of the previous upload become invalid.
  const DeviceBatch& upload(const Batch& b);

 private:
  Backend& backend_;
  const ModelConfig cfg_;
  Arena arena_;
  DeviceBatch db_;
  // Host staging of the derived metadata, kept between uploads so it stops reallocating.
  std::vector<int32_t> ids_, blk_, rope_, patch_image_, patch_zero_, patch_row_, patch_col_;
  std::vector<int32_t> stream_image_, stream_zero_, stream_patch_;
  std::vector<int32_t> patch_rope_, frame_dup_, image_slots_, stack_slot_;
  std::vector<MergeImage> merge_;
  std::vector<PosImage> pos_images_;
  std::vector<AttnRun> decoder_runs_, vision_runs_, stream_runs_;
  std::vector<uint8_t> slot_seen_;
};

}  // namespace dhp
