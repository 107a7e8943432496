// Posting order for transports that match point-to-point messages by order alone.
//
// The Communicator contract matches a send to a receive by (source, destination, tag) in
// posting order (MPI's rule). NCCL has no tags: between one pair of ranks the k-th send meets
// the k-th receive. Posting an exchange's transfers in the order given here makes the two
// rules pair the same messages: per peer and direction, ascending tag, the caller's order kept
// within one tag. Both ends sort the same way, so the k-th send of tag t to a peer lands
// before exactly as many smaller-tag messages as the peer's k-th receive of tag t, provided
// that every message of an exchange is received in the peer's matching exchange (which the
// ring attention and the tests do).
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/communicator.h"

namespace dhp {

// Indices into `transfers`, in the order to post them. Sends and receives keep their places
// relative to each other's kinds; only transfers with one peer and one kind are reordered.
std::vector<size_t> order_by_tag(const std::vector<Transfer>& transfers);

// Throws dhp::Error naming this rank when a transfer names a rank outside [0, world), a
// negative count, or no buffer for a non-empty message.
void check_exchange(const std::vector<Transfer>& transfers, int rank, int world);

}  // namespace dhp
