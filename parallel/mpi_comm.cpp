#include "parallel/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "kernels/check.h"
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
  }
  return MPI_DATATYPE_NULL;
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

class MpiExchange final : public PendingExchange {
 public:
  MpiExchange(std::vector<Transfer> transfers, MPI_Comm comm) : transfers_(std::move(transfers)) {
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
    if (!done_) MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    std::vector<MPI_Status> status(requests_.size());
    mpi_check(MPI_Waitall(int(requests_.size()), requests_.data(), status.data()), "MPI_Waitall");
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
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + size_t(off) * es, n,
                              mpi_type(type), op == ReduceOp::Sum ? MPI_SUM : MPI_MAX,
                              comm_), "MPI_Allreduce");
    }
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DataType type) override {
    mpi_check(MPI_Reduce_scatter_block(send, recv, checked_count(count, "reduce_scatter"),
                                       mpi_type(type), MPI_SUM, comm_),
              "MPI_Reduce_scatter_block");
  }
  void all_gather(const void* send, void* recv, int64_t count, DataType type) override {
    const int n = checked_count(count, "all_gather");
    mpi_check(MPI_Allgather(send, n, mpi_type(type), recv, n, mpi_type(type), comm_),
              "MPI_Allgather");
  }
  void broadcast(void* buf, int64_t count, DataType type, int root) override {
    DHP_CHECK(root >= 0 && root < size_, "broadcast from rank {} in a world of {}", root, size_);
    const size_t es = data_type_size(type);
    for (int64_t off = 0; off < count; off += kSlice) {
      const int n = int(std::min(kSlice, count - off));
      mpi_check(MPI_Bcast(static_cast<char*>(buf) + size_t(off) * es, n, mpi_type(type), root,
                          comm_), "MPI_Bcast");
    }
  }
  void barrier() override { mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }
  std::unique_ptr<PendingExchange> exchange(const std::vector<Transfer>& transfers) override {
    for (const Transfer& t : transfers)
      DHP_CHECK(t.peer >= 0 && t.peer < size_, "rank {}: transfer to rank {} in a world of {}",
                rank_, t.peer, size_);
    return std::make_unique<MpiExchange>(transfers, comm_);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int created_ = 0;
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
