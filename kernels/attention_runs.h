// The mask of an attention call as the host knows it: runs of tokens, and the pairing of query
// runs with key runs that libraries taking per-sequence lengths (cuDNN's fused attention) can
// run, or the reason they cannot.
//
// The mask rule is AttnMeta's (kernels/op_types.h). A run is a maximal span of consecutive
// tokens of one document and one block whose idx either counts up by one (text: the causal
// order) or does anything under a block (an image: idx does not matter inside it). The host
// builds runs where it builds the metadata (model/device_batch.cpp, the ring's exchange), so a
// backend can map a call onto per-sequence lengths without reading the device metadata back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/op_types.h"

namespace dhp {

// The runs of T tokens' host metadata, appended to `out` (cleared first).
void attention_runs(std::vector<AttnRun>& out, const int32_t* doc, const int32_t* idx,
                    const int32_t* blk, int64_t T);

// How a query run sees a key run.
enum class RunPair : uint8_t {
  none,      // no query sees any key
  full,      // every query sees every key
  causal,    // the same positions on both sides: query i sees keys 0..i (a causal diagonal)
  partial,   // anything else: some queries see some keys
};
RunPair pair_runs(const AttnRun& q, const AttnRun& k);

// One batch entry of a library call: a query span and the key span it sees entirely (full) or
// along the diagonal (causal).
struct AttnSegment {
  int64_t q_start, q_len, k_start, k_len;
  bool operator==(const AttnSegment&) const = default;
};

// A call as per-sequence batch entries: every visible (query run, key run) pair of the call is
// one segment, all of one kind, no query or key token in two segments (backward writes dK and
// dV once per key), key runs of one query run merged when they lie back to back and are all
// full, and the entries' keys in the same order as their queries (both are ragged offsets). `ok` false: the call needs a kernel that reads the per-token mask, and `why` says why.
struct AttnPartition {
  bool ok = false;
  std::string why;
  bool causal = false;            // the segments' kind: causal diagonals, or full blocks
  std::vector<AttnSegment> segs;  // in query order
  int64_t q_covered = 0, k_covered = 0;  // tokens in some segment
  int64_t max_q = 0, max_k = 0;          // the longest segment on each side
};
AttnPartition partition_attention(AttnRuns q, AttnRuns k);

}  // namespace dhp
