#include "parallel/mpi_comm.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <exception>
#include <functional>

#include "core/check.h"
#include "parallel/peer_wait.h"
#include "parallel/threaded_comm.h"

#ifdef DHP_MPI
#include <mpi.h>
#endif

namespace dhp {

#ifdef DHP_MPI
namespace {

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(fmt::format("{} failed: {}", what, std::string(msg, len)));
  }
}

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::F32: return MPI_FLOAT;
    case DataType::F64: return MPI_DOUBLE;
    case DataType::I32: return MPI_INT32_T;
    case DataType::I64: return MPI_INT64_T;
    case DataType::U8: return MPI_UINT8_T;
    case DataType::BF16: return MPI_UINT16_T;  // moved only: reduce_type() refuses it
  }
  return MPI_DATATYPE_NULL;
}

// The type of a reduction; bf16 activations are moved, never summed (gradients are fp32).
MPI_Datatype reduce_type(DataType t) {
  DHP_CHECK(t != DataType::BF16, "a reduction of {} is not supported", data_type_name(t));
  return mpi_type(t);
}

// MPI counts are int; collectives on larger buffers go in slices.
constexpr int64_t kSlice = INT_MAX / 2;

int checked_count(int64_t n, const char* what) {
  DHP_CHECK(n <= INT_MAX, "{} of {} elements: MPI counts are limited to {}", what, n, INT_MAX);
  return int(n);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Completes requests, polling as PeerPoll says (parallel/peer_wait.h). A wait longer than
// `timeout` seconds is an error naming this rank and what it waited for (a dead or stopped
// peer).
void wait_all(std::vector<MPI_Request>& reqs, MPI_Status* status, int rank, double timeout,
              const std::function<std::string()>& what) {
  for (PeerPoll poll;; poll.pause()) {
    int done = 0;
    mpi_check(MPI_Testall(int(reqs.size()), reqs.data(), &done, status), "MPI_Testall");
    if (done) return;
    if (poll.seconds() > timeout)
      throw Error(fmt::format("rank {}: no answer within {:.0f} s while waiting for {} (a rank "
                              "died, stopped or is far behind; parallel.timeout_s)",
                              rank, timeout, what()));
  }
}

class MpiExchange final : public PendingExchange {
 public:
  MpiExchange(std::vector<Transfer> transfers, MPI_Comm comm, int rank, double timeout)
      : transfers_(std::move(transfers)), rank_(rank), timeout_(timeout) {
    requests_.resize(transfers_.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < transfers_.size(); ++i) {
      const Transfer& t = transfers_[i];
      const int n = checked_count(t.count, "a point-to-point transfer");
      if (t.kind == Transfer::Send)
        mpi_check(MPI_Isend(t.buf, n, mpi_type(t.type), t.peer, t.tag, comm,
                            &requests_[i]), "MPI_Isend");
      else
        mpi_check(MPI_Irecv(t.buf, n, mpi_type(t.type), t.peer, t.tag, comm,
                            &requests_[i]), "MPI_Irecv");
    }
  }
  ~MpiExchange() override {
    // Dropped while an error unwinds (a peer that never answered, say): waiting here would
    // hang for ever on that peer, and the job is being taken down anyway.
    if (!done_ && std::uncaught_exceptions() == 0)
      MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    std::vector<MPI_Status> status(requests_.size());
    wait_all(requests_, status.data(), rank_, timeout_, [&] {
      std::vector<std::string> peers;
      for (size_t i = 0; i < transfers_.size(); ++i)
        if (requests_[i] != MPI_REQUEST_NULL)
          peers.push_back(fmt::format("{} rank {}", transfers_[i].kind == Transfer::Send ? "a send to"
                                                                                         : "a receive from",
                                      transfers_[i].peer));
      return fmt::format("{}", fmt::join(peers, ", "));
    });
    done_ = true;
    for (size_t i = 0; i < transfers_.size(); ++i) {
      const Transfer& t = transfers_[i];
      if (t.kind != Transfer::Recv) continue;
      int got = 0;
      MPI_Get_count(&status[i], mpi_type(t.type), &got);
      DHP_CHECK(got == t.count, "expected {} x {} from rank {} (tag {}), got {}", t.count,
                data_type_name(t.type), t.peer, t.tag, got);
    }
  }

 private:
  std::vector<Transfer> transfers_;
  std::vector<MPI_Request> requests_;
  int rank_;
  double timeout_;
  bool done_ = false;
};

// Reductions in flight (start_all_reduce, start_reduce): one request per slice of the buffer.
class MpiCollective final : public PendingExchange {
 public:
  MpiCollective(std::vector<MPI_Request> requests, int rank, double timeout)
      : requests_(std::move(requests)), rank_(rank), timeout_(timeout) {}
  ~MpiCollective() override {
    // As MpiExchange: never wait on a dead peer while an error unwinds.
    if (!done_ && std::uncaught_exceptions() == 0)
      MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    if (done_) return;
    wait_all(requests_, MPI_STATUSES_IGNORE, rank_, timeout_,
             [] { return std::string("an overlapped reduction with every rank"); });
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    mpi_check(MPI_Testall(int(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE),
              "MPI_Testall");
    return flag != 0;
  }

 private:
  std::vector<MPI_Request> requests_;
  int rank_;
  double timeout_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    // dhp's own copy of the world, so its messages never match a library's; the only
    // communicator a run creates.
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    ++created_;
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as codes (and then as dhp::Error) instead of aborting the job without
    // a word about which call failed.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int communicators_created() const override { return created_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) override {
    if (size_ == 1) return;
    const size_t es = data_type_size(type);
    for (int64_t off = 0; off < count; off += kSlice) {
      const int n = int(std::min(kSlice, count - off));
      std::vector<MPI_Request> r(1);
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(buf) + size_t(off) * es, n,
                               reduce_type(type), op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_,
                               &r[0]), "MPI_Iallreduce");
      finish(r, "an all-reduce");
    }
  }
  bool overlapping_collectives() const override { return true; }
  std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count, DataType type,
                                                    ReduceOp op) override {
    const size_t es = data_type_size(type);
    std::vector<MPI_Request> r;
    for (int64_t off = 0; size_ > 1 && off < count; off += kSlice) {
      const int n = int(std::min(kSlice, count - off));
      r.push_back(MPI_REQUEST_NULL);
      mpi_check(MPI_Iallreduce(MPI_IN_PLACE, static_cast<char*>(buf) + size_t(off) * es, n,
                               reduce_type(type), op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_,
                               &r.back()), "MPI_Iallreduce");
    }
    return std::make_unique<MpiCollective>(std::move(r), rank_, timeout_);
  }
  std::unique_ptr<PendingExchange> start_reduce(void* buf, int64_t count, DataType type,
                                                int root) override {
    DHP_CHECK(root >= 0 && root < size_, "reduce onto rank {} in a world of {}", root, size_);
    const size_t es = data_type_size(type);
    std::vector<MPI_Request> r;
    for (int64_t off = 0; size_ > 1 && off < count; off += kSlice) {
      const int n = int(std::min(kSlice, count - off));
      char* p = static_cast<char*>(buf) + size_t(off) * es;
      r.push_back(MPI_REQUEST_NULL);
      mpi_check(MPI_Ireduce(rank_ == root ? MPI_IN_PLACE : p, p, n, reduce_type(type), MPI_SUM, root,
                            comm_, &r.back()), "MPI_Ireduce");
    }
    return std::make_unique<MpiCollective>(std::move(r), rank_, timeout_);
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DataType type) override {
    std::vector<MPI_Request> r(1);
    mpi_check(MPI_Ireduce_scatter_block(send, recv, checked_count(count, "reduce_scatter"),
                                        reduce_type(type), MPI_SUM, comm_, &r[0]),
              "MPI_Ireduce_scatter_block");
    finish(r, "a reduce-scatter");
  }
  void all_gather(const void* send, void* recv, int64_t count, DataType type) override {
    const int n = checked_count(count, "all_gather");
    // A send that is already this rank's block of recv is gathered in place.
    const bool in_place =
        send == static_cast<char*>(recv) + size_t(rank_) * size_t(n) * data_type_size(type);
    std::vector<MPI_Request> r(1);
    mpi_check(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(type), recv, n,
                             mpi_type(type), comm_, &r[0]), "MPI_Iallgather");
    finish(r, "an all-gather");
  }
  void broadcast(void* buf, int64_t count, DataType type, int root) override {
    DHP_CHECK(root >= 0 && root < size_, "broadcast from rank {} in a world of {}", root, size_);
    const size_t es = data_type_size(type);
    for (int64_t off = 0; off < count; off += kSlice) {
      const int n = int(std::min(kSlice, count - off));
      std::vector<MPI_Request> r(1);
      mpi_check(MPI_Ibcast(static_cast<char*>(buf) + size_t(off) * es, n, mpi_type(type), root,
                           comm_, &r[0]), "MPI_Ibcast");
      finish(r, "a broadcast");
    }
  }
  void barrier() override {
    std::vector<MPI_Request> r(1);
    mpi_check(MPI_Ibarrier(comm_, &r[0]), "MPI_Ibarrier");
    finish(r, "a barrier");
  }
  void set_timeout(double seconds) override { timeout_ = seconds; }
  void abort(const std::string&) override { MPI_Abort(comm_, 1); }
  std::unique_ptr<PendingExchange> exchange(const std::vector<Transfer>& transfers) override {
    for (const Transfer& t : transfers)
      DHP_CHECK(t.peer >= 0 && t.peer < size_, "rank {}: transfer to rank {} in a world of {}",
                rank_, t.peer, size_);
    return std::make_unique<MpiExchange>(transfers, comm_, rank_, timeout_);
  }

 private:
  void finish(std::vector<MPI_Request>& r, const char* what) {
    wait_all(r, MPI_STATUSES_IGNORE, rank_, timeout_,
             [what] { return fmt::format("{} with every rank", what); });
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int created_ = 0;
  double timeout_ = kDefaultTimeoutSeconds;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> start_world(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    mpi_check(MPI_Init(argc, argv), "MPI_Init");
    // MPI can be initialised once per process, so it is finalised at exit rather than when
    // the communicator goes: a later run in the same process (tests) still works.
    std::atexit(finalize_at_exit);
  }
  return std::make_unique<MpiCommunicator>();
}
#else
// Without MPI a process is a world of one: the threaded world with a single rank is exactly that.
std::unique_ptr<Communicator> start_world(int*, char***) {
  return std::make_unique<ThreadedCommunicator>(std::make_shared<ThreadedWorld>(1), 0);
}
#endif

}  // namespace dhp
