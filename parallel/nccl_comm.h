// The Communicator over NCCL, for runs on the CUDA backend: NCCL communicators made once, at
// start-up, from ncclUniqueIds that rank 0 broadcasts over a bootstrap communicator (the MPI
// world, or a threaded world in tests). Two of them: one for every blocking call and exchange
// (ring transfers), one for the optimizer's overlapped gradient reductions (below). Groups
// never create more.
//
// Buffers: device memory (or managed memory) of the device this rank was built on. NCCL
// cannot read host memory, so a call whose buffers are all host memory (the trainer's loss
// sums, stop flags and timings) goes to the bootstrap communicator instead; a call that mixes
// host and device buffers is an error. Both transports are blocking from the caller's view and
// every rank makes the same calls in the same order, so the two never wait on each other.
//
// Ordering: the collectives and exchanges run on one stream (this object's own, or the
// backend's stream given to the constructor). With its own stream, which is created as a
// blocking stream, work the caller queued on the legacy default stream finishes first; after
// follow(backend) every call also waits (on the device, through an event) for the work queued
// so far on the backend's stream. Every blocking call returns when its result is in place.
//
// Tags: NCCL has none. Between two ranks the k-th send meets the k-th receive, so an exchange
// posts its transfers per peer by ascending tag (parallel/exchange_order.h), which pairs the
// same messages as MPI's (source, destination, tag) rule as long as every message of an
// exchange is received in the peer's matching exchange. NCCL cannot check counts either: a
// receive that names another count or type than its send is undefined (garbage or a hang that
// the timeout ends), not an error message as on the other transports.
//
// Reproducibility: NCCL chooses its algorithm (ring, tree) by message size and topology, so a
// reduction's order is fixed on one machine for one size, not across machines or NCCL
// versions as it is for the MPI and threaded communicators.
//
// Timeouts: the communicator is non-blocking (ncclConfig_t::blocking = 0). Every call polls
// its completion event and ncclCommGetAsyncError; past the timeout (set_timeout) or on an
// asynchronous error it aborts the NCCL communicator and throws dhp::Error naming this rank
// and what it waited for. After that every call throws.
//
// Overlapped collectives (start_all_reduce, start_reduce, start_broadcast: the optimizer's
// gradient buckets and ZeRO-2's sums, started while backward goes on, and ZeRO-3's layer
// gathers, started while the layer before computes) run on the second communicator and a stream of their own,
// after the backend's queued work. They cannot share the first: NCCL needs every rank to issue
// one communicator's operations in the same order, and the buckets interleave with each rank's
// ring transfers in an order that differs from rank to rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "parallel/communicator.h"

namespace dhp {

ncclDataType_t nccl_type(DataType t);
ncclRedOp_t nccl_op(ReduceOp op);

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`: every rank constructs at the same time, on the CUDA device
  // current in the calling thread, which every later call uses. `stream` null: its own.
  NcclCommunicator(Communicator& bootstrap, cudaStream_t stream = nullptr);
  // The same, owning the bootstrap (the trainer's MPI world).
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, cudaStream_t stream = nullptr);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  int communicators_created() const override { return created_; }
  void set_timeout(double seconds) override;
  // ncclCommAbort, then the bootstrap's abort (which ends the job's other ranks).
  void abort(const std::string& why) override;

  void all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DataType type) override;
  void all_gather(const void* send, void* recv, int64_t count, DataType type) override;
  void broadcast(void* buf, int64_t count, DataType type, int root) override;
  // A one-element all-reduce on the device: NCCL has no barrier of its own.
  void barrier() override;
  std::unique_ptr<PendingExchange> exchange(const std::vector<Transfer>& transfers) override;
  // Every later call first makes this communicator's stream wait for the work queued so far
  // on the backend's stream (an event, not a host synchronisation).
  void follow(Backend& backend) override;
  bool overlapping_collectives() const override { return true; }
  std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count, DataType type,
                                                    ReduceOp op) override;
  std::unique_ptr<PendingExchange> start_broadcast(void* buf, int64_t count, DataType type, int root) override;
  std::unique_ptr<PendingExchange> start_reduce(void* buf, int64_t count, DataType type,
                                                int root) override;

  // Waits for `event` (recorded after work of this communicator) like every call does:
  // polling, with the timeout, aborting and throwing on a peer that never answers.
  void wait_event(cudaEvent_t event, const std::string& what);

 private:
  void init(cudaStream_t stream);   // start(), releasing what it made when it throws
  void start(cudaStream_t stream);
  void close() noexcept;            // finalizes (or aborts) NCCL, frees the stream and buffers
  // Whether the buffers are host memory (then the bootstrap handles the call); throws when
  // they mix host and device memory.
  bool on_host(std::initializer_list<const void*> bufs, const char* what) const;
  // Checks an NCCL call's result; a call that is still in progress (non-blocking mode) is
  // waited for with the timeout before the next NCCL call may be made.
  void nccl_done(ncclResult_t r, const std::string& what);
  void nccl_done(ncclResult_t r, const std::string& what, ncclComm_t comm);
  void enqueue_done(const std::string& what);  // records the event and waits for it
  void after_compute(cudaStream_t s);           // s waits for compute_'s queued work
  // An exchange that completes when the work queued so far on `s` has.
  std::unique_ptr<PendingExchange> pending_on(cudaStream_t s, const std::string& what);
  [[noreturn]] void fail(const std::string& message);
  void check_usable(const std::string& what) const;

  std::unique_ptr<Communicator> owned_;
  Communicator& bootstrap_;
  int rank_ = 0, size_ = 1, device_ = 0;
  int created_ = 0;
  double timeout_ = kDefaultTimeoutSeconds;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  ncclComm_t grads_comm_ = nullptr;     // overlapped reductions
  cudaStream_t grads_stream_ = nullptr;
  cudaStream_t compute_ = nullptr;  // the backend's stream (follow), or none
  cudaEvent_t computed_ = nullptr;  // recorded on compute_ before each call
  cudaEvent_t done_ = nullptr;
  void* scratch_ = nullptr;  // the barrier's one int32 on the device
  std::string failure_;      // why the communicator was aborted; empty while usable
};

// The trainer's device communicator: selects this rank's device (its rank on the node, from
// the launcher's OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or SLURM_LOCALID, else its world
// rank, modulo the devices), makes it current, and wraps the world it then owns.
std::unique_ptr<Communicator> make_nccl_world(std::unique_ptr<Communicator> world);

}  // namespace dhp
