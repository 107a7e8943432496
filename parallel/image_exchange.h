// Moving encoded image tokens inside a ring group (design.md §4: vision inside a group).
//
// A group's images are never split: each is encoded whole on one rank of the group, chosen
// by patch count so the encoders are balanced (assign_images). The decoder positions of an
// image's merged tokens may lie on any ranks of the ring (zigzag pieces cut through images),
// so after the encoder every rank sends each row to the rank holding its position, and after
// the decoder the rows' gradients come back the same way. Rows go out in the order the
// receiver expects them: both sides sort a pair's rows by (sequence, position), which each
// computes from the plan alone — no counts or indices are exchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/image_route.h"
#include "parallel/communicator.h"
#include "parallel/peer_wait.h"

namespace dhp {

// The encoder of each image: images dealt largest first (by patches; ties by their order in
// `patches`) to the rank with the fewest patches so far (ties: the lowest index). This is the
// assignment the cost model prices (balance_images, parallel/cost_model.h). Returns a rank
// index in [0, d) per image.
std::vector<int> assign_images(const std::vector<int64_t>& patches, int d);
// (Merged tokens serve as well as patches: every image has merge² patches per token.)

class ImageExchange final : public ImageRoute {
 public:
  ImageExchange(Communicator& comm, Backend& backend);

  // One group's routing. ring: the group's world ranks in ring order, this rank among them.
  // send[i]: for each row ring member i receives from this rank, in i's order, the row of
  // this rank's encoded tokens (N of them) to send, or -1 for a row of zeros (an image that
  // failed to load in on_error = "skip" mode). recv[i]: rows this rank receives from member i.
  // C: the row width.
  void prepare(const std::vector<int>& ring, const std::vector<std::vector<int32_t>>& send,
               const std::vector<int64_t>& recv, int64_t N, int64_t C);

  int64_t rows() const override { return R_; }
  CAct forward(CAct tokens, int64_t C) override;
  void backward(Act dtokens, CAct drows, int64_t C) override;

  // Time spent waiting for transfers since the last prepare(), as RingAttention counts it.
  double wait_seconds() const { return waited_.wall; }
  double wait_cpu_seconds() const { return waited_.cpu; }

 private:
  // Sends segments of `from` (laid out by `from_off`) and receives into `into` (by `into_off`),
  // member by member; this rank's own segment is a device copy.
  void move(CAct from, const std::vector<int64_t>& from_off, const std::vector<int64_t>& from_n,
            Act into, const std::vector<int64_t>& into_off,
            const std::vector<int64_t>& into_n, int tag);

  Communicator& comm_;
  Backend& backend_;
  const Ops& ops_;
  Arena arena_;
  std::vector<int> ring_;
  int me_ = 0;
  int64_t N_ = 0, S_ = 0, R_ = 0, C_ = 0;
  std::vector<int64_t> send_off_, send_n_, recv_off_, recv_n_;  // per member, in rows
  std::vector<int32_t> idx_host_;
  int32_t* idx_ = nullptr;  // (S) source row of each row sent, -1 = zeros
  Act send_;                // (S, C) rows out, by member; in backward their gradients
  Act recv_;                // (R, C) rows in, by member
  WaitTime waited_;
};

}  // namespace dhp
