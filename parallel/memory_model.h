// Memory model of design.md §2.2: bytes one rank needs to run its share of a group.
//
//   static (weights + gradients + optimizer state, the latter / N under ZeRO-1)
//   + activations: per decoder token, and per vision patch (m² per image token)
//   + logits buffer: min(tokens, chunk) x vocab in fp32, with its gradient
//   + ring buffers (double-buffered K/V and dK/dV blocks, per decoder token) + workspace.
//
// A rank of a group with ring degree c holds ceil(L/c) tokens of a sequence of L at most
// (zigzag split, plan.h); image tokens are assumed spread in proportion, so a rank holding
// t tokens of sequence s holds ceil(t · m² · V_s / L_s) patches.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "parallel/cost_model.h"

namespace dhp {

class MemoryModel {
 public:
  MemoryModel(const ModelConfig& model, const DeviceProfile& device, int world, double memory_gb,
              bool zero1, bool recompute = false);

  int64_t capacity() const { return capacity_; }
  int64_t parameters() const { return params_; }
  int64_t static_bytes() const { return static_; }
  int64_t bytes_per_token() const { return per_token_; }   // decoder token
  int64_t bytes_per_patch() const { return per_patch_; }   // vision patch before the merge

  // Activation bytes (no static, logits or workspace) of t tokens of sequence s.
  int64_t activation_bytes(const SeqShape& s, int64_t t) const;
  // A whole rank: activations already summed over its sequences, `tokens` in total.
  int64_t rank_bytes(int64_t activations, int64_t tokens) const;
  // The most any rank of a ring of degree c needs for these sequences.
  int64_t group_bytes(const std::vector<const SeqShape*>& seqs, int c) const;
  // The smallest ring degree <= max_degree at which the sequences fit; max_degree + 1 if none.
  int min_degree(const std::vector<const SeqShape*>& seqs, int max_degree) const;

 private:
  int64_t capacity_, params_, static_, per_token_, per_patch_, logits_per_token_, fixed_;
  int64_t logits_chunk_;
  int m2_;
};

}  // namespace dhp
