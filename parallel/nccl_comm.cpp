#include "parallel/nccl_comm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

#include "core/check.h"
#include "kernels/cuda/check.h"
#include "parallel/exchange_order.h"
#include "parallel/peer_wait.h"

namespace dhp {

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::F32: return ncclFloat32;
    case DataType::F64: return ncclFloat64;
    case DataType::I32: return ncclInt32;
    case DataType::I64: return ncclInt64;
    case DataType::U8: return ncclUint8;
    case DataType::BF16: return ncclBfloat16;
  }
  throw Error(fmt::format("no NCCL type for data type {}", int(t)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
  }
  throw Error(fmt::format("no NCCL reduction for operation {}", int(op)));
}

namespace {

// What rank 0 broadcasts: the id, or word that it could not make one (so the other ranks stop
// at once instead of waiting for an init that never comes).
struct IdMessage {
  int32_t ok = 0;
  ncclUniqueId id{};
};

std::string describe(const char* what, int64_t count, DataType type) {
  return fmt::format("{} of {} x {} with every rank", what, count, data_type_name(type));
}

class NcclExchange final : public PendingExchange {
 public:
  NcclExchange(NcclCommunicator& comm, cudaEvent_t event, std::string what)
      : comm_(comm), event_(event), what_(std::move(what)) {}
  ~NcclExchange() override {
    // Dropped unwaited: the transfers may still read and write the caller's buffers, so wait
    // for them. Dropped while an error unwinds, the job is going down and a stopped peer would
    // only add the timeout. A failure here has aborted the communicator, so the next call on
    // it reports the error; a destructor cannot.
    if (!done_ && std::uncaught_exceptions() == 0) {
      try {
        comm_.wait_event(event_, what_);
      } catch (const std::exception&) {
      }
    }
    cudaEventDestroy(event_);
  }
  void wait() override {
    if (done_) return;
    comm_.wait_event(event_, what_);
    done_ = true;
  }

 private:
  NcclCommunicator& comm_;
  cudaEvent_t event_;
  std::string what_;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(Communicator& bootstrap, cudaStream_t stream)
    : bootstrap_(bootstrap) {
  init(stream);
}

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> bootstrap, cudaStream_t stream)
    : owned_(std::move(bootstrap)), bootstrap_(*owned_) {
  init(stream);
}

void NcclCommunicator::init(cudaStream_t stream) {
  try {
    start(stream);
  } catch (...) {
    close();
    throw;
  }
}

void NcclCommunicator::start(cudaStream_t stream) {
  rank_ = bootstrap_.rank();
  size_ = bootstrap_.size();
  DHP_CUDA_CHECK(cudaGetDevice(&device_));
  IdMessage msg;
  if (rank_ == 0) msg.ok = ncclGetUniqueId(&msg.id) == ncclSuccess ? 1 : 0;
  bootstrap_.broadcast(&msg, int64_t(sizeof(msg)), DataType::U8, 0);
  DHP_CHECK(msg.ok == 1, "rank {}: rank 0 could not create the NCCL communicator's id", rank_);

  if (stream) {
    stream_ = stream;
  } else {
    // A blocking stream: it waits for the legacy default stream's earlier work and the other
    // way round, so callers on the default stream need no synchronisation of their own.
    DHP_CUDA_CHECK(cudaStreamCreate(&stream_));
    own_stream_ = true;
  }
  DHP_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  DHP_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));

  // Non-blocking, so that no NCCL call can hang the host beyond the timeout: a call that
  // returns ncclInProgress is polled like the work it queues.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  nccl_done(ncclCommInitRankConfig(&comm_, size_, msg.id, rank_, &config),
            fmt::format("the NCCL communicator's creation ({} ranks)", size_));
  created_ = 1;

  // The overlapped reductions' own communicator and stream (see the header).
  IdMessage grads;
  if (rank_ == 0) grads.ok = ncclGetUniqueId(&grads.id) == ncclSuccess ? 1 : 0;
  bootstrap_.broadcast(&grads, int64_t(sizeof(grads)), DataType::U8, 0);
  DHP_CHECK(grads.ok == 1, "rank {}: rank 0 could not create the gradient communicator's id", rank_);
  DHP_CUDA_CHECK(cudaStreamCreateWithFlags(&grads_stream_, cudaStreamNonBlocking));
  ncclConfig_t grads_config = NCCL_CONFIG_INITIALIZER;
  grads_config.blocking = 0;
  nccl_done(ncclCommInitRankConfig(&grads_comm_, size_, grads.id, rank_, &grads_config),
            fmt::format("the gradient NCCL communicator's creation ({} ranks)", size_), grads_comm_);
  created_ = 2;
}

NcclCommunicator::~NcclCommunicator() { close(); }

void NcclCommunicator::close() noexcept {
  for (ncclComm_t* c : {&grads_comm_, &comm_}) {
    if (!*c) continue;
    // Finalizing flushes the communicator's work and meets the other ranks; while an error
    // unwinds they may be gone, so abort at once instead.
    bool clean = false;
    if (std::uncaught_exceptions() == 0) {
      ncclResult_t r = ncclCommFinalize(*c);
      const auto t0 = std::chrono::steady_clock::now();
      while (r == ncclInProgress &&
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(*c, &r) != ncclSuccess) break;
      }
      clean = r == ncclSuccess;
    }
    if (clean)
      ncclCommDestroy(*c);
    else
      ncclCommAbort(*c);
    *c = nullptr;
  }
  if (scratch_) cudaFree(scratch_);
  if (done_) cudaEventDestroy(done_);
  if (computed_) cudaEventDestroy(computed_);
  if (grads_stream_) cudaStreamDestroy(grads_stream_);
  if (own_stream_) cudaStreamDestroy(stream_);
  scratch_ = nullptr, done_ = nullptr, computed_ = nullptr, grads_stream_ = nullptr;
  own_stream_ = false;
}

void NcclCommunicator::set_timeout(double seconds) {
  timeout_ = seconds;
  bootstrap_.set_timeout(seconds);
}

void NcclCommunicator::abort(const std::string& why) {
  if (comm_) failure_ = why;
  for (ncclComm_t* c : {&comm_, &grads_comm_})
    if (*c) ncclCommAbort(*c), *c = nullptr;
  bootstrap_.abort(why);
}

void NcclCommunicator::fail(const std::string& message) {
  for (ncclComm_t* c : {&comm_, &grads_comm_})
    if (*c) ncclCommAbort(*c), *c = nullptr;
  failure_ = message;
  throw Error(message);
}

void NcclCommunicator::check_usable(const std::string& what) const {
  DHP_CHECK(failure_.empty(), "rank {}: {}: the NCCL communicator was aborted earlier: {}", rank_,
            what, failure_);
  DHP_CHECK(comm_ != nullptr, "rank {}: {}: the NCCL communicator is gone", rank_, what);
}

bool NcclCommunicator::on_host(std::initializer_list<const void*> bufs, const char* what) const {
  int host = 0, device = 0;
  for (const void* p : bufs) {
    if (p == nullptr) continue;
    cudaPointerAttributes a{};
    DHP_CUDA_CHECK(cudaPointerGetAttributes(&a, p));
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged)
      ++device;
    else
      ++host;
  }
  DHP_CHECK(host == 0 || device == 0,
            "rank {}: {} mixes host and device buffers: NCCL reads device memory only, the "
            "bootstrap communicator host memory only", rank_, what);
  return host > 0;
}

void NcclCommunicator::nccl_done(ncclResult_t r, const std::string& what) {
  nccl_done(r, what, comm_);
}

void NcclCommunicator::nccl_done(ncclResult_t r, const std::string& what, ncclComm_t comm) {
  for (PeerPoll poll; r == ncclInProgress;) {
    if (poll.seconds() > timeout_)
      fail(fmt::format("rank {}: no answer within {:.0f} s while NCCL set up {} (a rank died, "
                       "stopped or is far behind; parallel.timeout_s)", rank_, timeout_, what));
    poll.pause();
    const ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess) r = q;
  }
  if (r != ncclSuccess)
    fail(fmt::format("rank {}: NCCL error in {}: {} ({})", rank_, what, ncclGetErrorString(r),
                     comm ? ncclGetLastError(comm) : "no communicator"));
}

void NcclCommunicator::wait_event(cudaEvent_t event, const std::string& what) {
  check_usable(what);
  for (PeerPoll poll;; poll.pause()) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady)
      fail(fmt::format("rank {}: CUDA error {} ({}) while waiting for {} on device {}", rank_,
                       int(e), cudaGetErrorString(e), what, device_));
    for (ncclComm_t c : {comm_, grads_comm_}) {
      ncclResult_t async = ncclSuccess;
      const ncclResult_t q = ncclCommGetAsyncError(c, &async);
      if (q != ncclSuccess) async = q;
      if (async != ncclSuccess && async != ncclInProgress)
        fail(fmt::format("rank {}: NCCL error while waiting for {}: {} ({})", rank_, what,
                         ncclGetErrorString(async), ncclGetLastError(c)));
    }
    if (poll.seconds() > timeout_)
      fail(fmt::format("rank {}: no answer within {:.0f} s while waiting for {} (a rank died, "
                       "stopped or is far behind; parallel.timeout_s)", rank_, timeout_, what));
  }
}

void NcclCommunicator::follow(Backend& backend) {
  compute_ = static_cast<cudaStream_t>(backend.stream_handle());
  if (compute_ && !computed_) DHP_CUDA_CHECK(cudaEventCreateWithFlags(&computed_, cudaEventDisableTiming));
}

void NcclCommunicator::after_compute(cudaStream_t s) {
  if (!compute_ || compute_ == s) return;
  DHP_CUDA_CHECK(cudaEventRecord(computed_, compute_));
  DHP_CUDA_CHECK(cudaStreamWaitEvent(s, computed_, 0));
}

void NcclCommunicator::enqueue_done(const std::string& what) {
  DHP_CUDA_CHECK(cudaEventRecord(done_, stream_));
  wait_event(done_, what);
}

void NcclCommunicator::all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) {
  if (on_host({buf}, "all_reduce")) return bootstrap_.all_reduce(buf, count, type, op);
  const std::string what = describe(op == ReduceOp::Sum ? "an all-reduce (sum)" : "an all-reduce (max)",
                                    count, type);
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(stream_);
  nccl_done(ncclAllReduce(buf, buf, size_t(count), nccl_type(type), nccl_op(op), comm_, stream_), what);
  enqueue_done(what);
}

void NcclCommunicator::reduce_scatter(const void* send, void* recv, int64_t count, DataType type) {
  if (on_host({send, recv}, "reduce_scatter")) return bootstrap_.reduce_scatter(send, recv, count, type);
  const std::string what = describe("a reduce-scatter", count, type);
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(stream_);
  // NCCL's own in-place form is recv == send + rank·count, the Communicator's.
  nccl_done(ncclReduceScatter(send, recv, size_t(count), nccl_type(type), ncclSum, comm_, stream_),
            what);
  enqueue_done(what);
}

void NcclCommunicator::all_gather(const void* send, void* recv, int64_t count, DataType type) {
  if (on_host({send, recv}, "all_gather")) return bootstrap_.all_gather(send, recv, count, type);
  const std::string what = describe("an all-gather", count, type);
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(stream_);
  // NCCL gathers in place itself when send is this rank's block of recv.
  nccl_done(ncclAllGather(send, recv, size_t(count), nccl_type(type), comm_, stream_), what);
  enqueue_done(what);
}

void NcclCommunicator::broadcast(void* buf, int64_t count, DataType type, int root) {
  DHP_CHECK(root >= 0 && root < size_, "broadcast from rank {} in a world of {}", root, size_);
  if (on_host({buf}, "broadcast")) return bootstrap_.broadcast(buf, count, type, root);
  const std::string what = fmt::format("a broadcast of {} x {} from rank {}", count,
                                       data_type_name(type), root);
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(stream_);
  nccl_done(ncclBroadcast(buf, buf, size_t(count), nccl_type(type), root, comm_, stream_), what);
  enqueue_done(what);
}

void NcclCommunicator::barrier() {
  const std::string what = "a barrier with every rank";
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(stream_);
  nccl_done(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), what);
  enqueue_done(what);
}

std::unique_ptr<PendingExchange> NcclCommunicator::exchange(const std::vector<Transfer>& transfers) {
  check_exchange(transfers, rank_, size_);
  int host = 0, nonempty = 0;  // an empty transfer may have no buffer: it goes either way
  for (const Transfer& t : transfers)
    if (t.count > 0) ++nonempty, host += on_host({t.buf}, "exchange") ? 1 : 0;
  DHP_CHECK(host == 0 || host == nonempty,
            "rank {}: an exchange mixes host and device buffers: NCCL reads device memory only, "
            "the bootstrap communicator host memory only", rank_);
  if (host > 0) return bootstrap_.exchange(transfers);

  std::vector<std::string> peers;
  for (const Transfer& t : transfers)
    peers.push_back(fmt::format("{} rank {} (tag {})",
                                t.kind == Transfer::Send ? "a send to" : "a receive from", t.peer, t.tag));
  const std::string what = peers.empty() ? std::string("an empty exchange")
                                         : fmt::format("{}", fmt::join(peers, ", "));
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(stream_);
  nccl_done(ncclGroupStart(), what);
  ncclResult_t first_error = ncclSuccess;
  for (size_t i : order_by_tag(transfers)) {
    const Transfer& t = transfers[i];
    const ncclResult_t r =
        t.kind == Transfer::Send
            ? ncclSend(t.buf, size_t(t.count), nccl_type(t.type), t.peer, comm_, stream_)
            : ncclRecv(t.buf, size_t(t.count), nccl_type(t.type), t.peer, comm_, stream_);
    if (first_error == ncclSuccess && r != ncclSuccess && r != ncclInProgress) first_error = r;
  }
  // The group is closed even after a failed post: an open group would swallow later calls.
  const ncclResult_t end = ncclGroupEnd();
  nccl_done(first_error != ncclSuccess ? first_error : end, what);
  return pending_on(stream_, what);
}

std::unique_ptr<PendingExchange> NcclCommunicator::pending_on(cudaStream_t s, const std::string& what) {
  cudaEvent_t event = nullptr;
  DHP_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t rec = cudaEventRecord(event, s);
  if (rec != cudaSuccess) cudaEventDestroy(event);
  DHP_CUDA_CHECK(rec);
  return std::make_unique<NcclExchange>(*this, event, what);
}

std::unique_ptr<PendingExchange> NcclCommunicator::start_all_reduce(void* buf, int64_t count,
                                                                    DataType type, ReduceOp op) {
  if (on_host({buf}, "start_all_reduce")) return bootstrap_.start_all_reduce(buf, count, type, op);
  const std::string what = describe("an overlapped all-reduce", count, type);
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(grads_stream_);
  nccl_done(ncclAllReduce(buf, buf, size_t(count), nccl_type(type), nccl_op(op), grads_comm_,
                          grads_stream_),
            what, grads_comm_);
  return pending_on(grads_stream_, what);
}

std::unique_ptr<PendingExchange> NcclCommunicator::start_reduce(void* buf, int64_t count,
                                                                DataType type, int root) {
  DHP_CHECK(root >= 0 && root < size_, "reduce onto rank {} in a world of {}", root, size_);
  if (on_host({buf}, "start_reduce")) return bootstrap_.start_reduce(buf, count, type, root);
  const std::string what = fmt::format("an overlapped reduce of {} x {} onto rank {}", count,
                                       data_type_name(type), root);
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(grads_stream_);
  // In place on the root; the other ranks' buffers are only read.
  nccl_done(ncclReduce(buf, buf, size_t(count), nccl_type(type), ncclSum, root, grads_comm_,
                       grads_stream_),
            what, grads_comm_);
  return pending_on(grads_stream_, what);
}

std::unique_ptr<PendingExchange> NcclCommunicator::start_broadcast(void* buf, int64_t count, DataType type,
                                                                   int root) {
  DHP_CHECK(root >= 0 && root < size_, "broadcast from rank {} in a world of {}", root, size_);
  if (on_host({buf}, "start_broadcast")) return bootstrap_.start_broadcast(buf, count, type, root);
  const std::string what = fmt::format("an overlapped broadcast of {} x {} from rank {}", count,
                                       data_type_name(type), root);
  check_usable(what);
  DHP_CUDA_CHECK(cudaSetDevice(device_));
  after_compute(grads_stream_);
  nccl_done(ncclBroadcast(buf, buf, size_t(count), nccl_type(type), root, grads_comm_, grads_stream_), what,
            grads_comm_);
  return pending_on(grads_stream_, what);
}

std::unique_ptr<Communicator> make_nccl_world(std::unique_ptr<Communicator> world) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  DHP_CHECK(e == cudaSuccess && devices > 0, "rank {}: train.device = \"cuda\" with {} ranks, "
            "but this process has no usable CUDA device ({})", world->rank(), world->size(),
            e == cudaSuccess ? std::string("none found") : std::string(cudaGetErrorString(e)));
  const int local = launcher_local_rank() >= 0 ? launcher_local_rank() : world->rank();
  DHP_CUDA_CHECK(cudaSetDevice(local % devices));
  return std::make_unique<NcclCommunicator>(std::move(world));
}

}  // namespace dhp
