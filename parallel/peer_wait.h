// How a rank waits for its peers, shared by every transport and by the callers that time it.
#pragma once

#include <chrono>

#include "parallel/communicator.h"

namespace dhp {

// Time spent waiting for transfers: wall seconds, and this thread's CPU seconds (an MPI wait
// may spin), so that a rank's busy time can leave its waits out.
struct WaitTime {
  double wall = 0.0, cpu = 0.0;
  void wait(PendingExchange& ex);  // ex.wait(), timed
};

// The pause between two polls of something peers complete (MPI requests, CUDA events of NCCL
// work). A non-blocking MPI collective advances one round of its schedule per MPI call, and a
// layer's ring transfer on a GPU takes microseconds, so the first 5 ms poll back to back,
// yielding the core to any other runnable process (more ranks than cores, or another job).
// A wait that lasts longer (a peer still computing) sleeps between polls, growing to 100 µs:
// short enough that a collective of many rounds finishes promptly once the peer arrives (with
// millisecond sleeps a ZeRO-1 bucket reduction added 30-90 ms to a 2-rank step), long enough
// to leave the core to others.
class PeerPoll {
 public:
  double seconds() const;  // since construction
  void pause();            // after a poll that found the work unfinished

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::chrono::microseconds sleep_{0};
};

}  // namespace dhp
