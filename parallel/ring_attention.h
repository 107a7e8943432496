// Ring attention over a context-parallel group (design.md §4), behind the attention seam.
//
// Each rank of the group holds some tokens of the group's sequences — normally their zigzag
// pieces (zigzag_ranges, parallel/plan.h), but any split works: the mask comes from every
// token's (doc, idx, blk), with doc numbering the group's sequences and idx their positions. Forward
// runs d-1 ring steps: the K/V block of rank i-s reaches rank i at step s, its partial
// attention is merged into the running output through the log-sum-exp, and the next block is
// already in flight while the current one computes. Backward passes K/V around the ring the
// same way, together with the dK/dV accumulators of each block, which every rank adds its
// queries' contribution to; after d steps each block's accumulator is home. The running
// output, dQ's sum over the blocks and the dK/dV accumulators are fp32 in any storage, and
// rounded to it once at the end. Blocks that the
// mask hides entirely from this rank's queries are not computed.
//
// The group is a list of world ranks on the one global communicator: forming a group creates
// no communicator, and different groups run their rings side by side.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "model/attention_seam.h"
#include "parallel/communicator.h"
#include "parallel/peer_wait.h"

namespace dhp {

class RingAttention final : public Attention {
 public:
  // group: the world ranks of the ring in ring order; this rank must be one of them.
  RingAttention(Communicator& comm, Backend& backend, std::vector<int> group);
  // Another group for the next pass (its buffers are kept: no allocation once warm).
  void regroup(std::vector<int> group);
  // Exchanges every member's token count and metadata (once per pass, not per layer).
  void prepare(AttnMeta meta, int64_t T) override;
  void forward(int layer, Act out, float* lse, CAct q, CAct k, CAct v,
               const AttnDims& d) override;
  void backward(int layer, Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q,
                CAct k, CAct v, const AttnDims& d) override;
  // Key blocks this rank computed in the last forward (of d): shows the mask-skipping.
  int blocks_computed() const { return blocks_computed_; }
  // Time spent waiting for transfers since the last prepare(): wall seconds, and this
  // thread's CPU seconds (an MPI wait may spin), so busy time can leave the waiting out.
  double wait_seconds() const { return waited_.wall; }
  double wait_cpu_seconds() const { return waited_.cpu; }

 private:
  int source(int step) const { return (me_ - step % d_ + d_) % d_; }  // block held at a step
  int tag(int layer, int what) const;
  // Starts sending a and b (n_send each) to the next rank and receiving the previous rank's
  // pair (n_recv each) into into_a and into_b.
  std::unique_ptr<PendingExchange> pass_pair(CAct a, CAct b, int64_t n_send, Act into_a,
                                             Act into_b, int64_t n_recv,
                                             int tag_a, int tag_b);
  AttnMeta member_meta(int j) const;

  Communicator& comm_;
  Backend& backend_;
  const Ops& ops_;
  std::vector<int> group_;
  int d_ = 1, me_ = 0, next_ = 0, prev_ = 0;  // ring size, my index, neighbours (world ranks)
  AttnMeta meta_{};                           // my tokens
  std::vector<int64_t> T_;                    // tokens of every member
  std::vector<char> visible_;                 // member j has a key my queries may see
  Arena meta_arena_, work_;
  std::vector<int32_t*> doc_, idx_, blk_;     // (T_[j]) every member's metadata, device
  std::vector<std::vector<AttnRun>> runs_;    // every member's runs, host
  int blocks_computed_ = 0;
  WaitTime waited_;
};

}  // namespace dhp
