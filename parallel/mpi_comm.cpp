#include "parallel/mpi_comm.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <climits>
#include <cstdlib>
#include <exception>
#include <functional>
#include <set>

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

// Who is still there, when a wait has run out. A wait that times out says which peer
// requests are open, but in a collective every rank waits for every other, so that names no
// one. Instead the rank sends a probe to every other rank; every rank polling in any wait
// answers probes at once (answer_probes), so a rank that stays silent through a short grace is
// stopped, dead or busy far from any wait. Tags above every tag the engine uses (ring
// attention and the image exchange reach 31001), on dhp's own communicator.
constexpr int kProbeTag = 32760;
constexpr int kAnswerTag = 32761;
constexpr double kProbeGraceSeconds = 3.0;
const char kProbeByte = 1;  // static: a freed send request may still read it

void answer_probes(MPI_Comm comm) {
  for (;;) {
    int pending = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kProbeTag, comm, &pending, &st) != MPI_SUCCESS || !pending) return;
    char byte = 0;
    MPI_Recv(&byte, 1, MPI_CHAR, st.MPI_SOURCE, kProbeTag, comm, MPI_STATUS_IGNORE);
    MPI_Request answer;
    MPI_Isend(&kProbeByte, 1, MPI_CHAR, st.MPI_SOURCE, kAnswerTag, comm, &answer);
    MPI_Request_free(&answer);
  }
}

// The ranks that do not answer a probe within the grace (answering others' probes meanwhile).
std::vector<int> silent_ranks(MPI_Comm comm, int rank, int size) {
  std::vector<MPI_Request> answers(size_t(size), MPI_REQUEST_NULL);
  std::vector<char> got(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    MPI_Request probe;
    MPI_Isend(&kProbeByte, 1, MPI_CHAR, r, kProbeTag, comm, &probe);
    MPI_Request_free(&probe);  // a stopped rank never takes it; nothing to wait for
    MPI_Irecv(&got[size_t(r)], 1, MPI_CHAR, r, kAnswerTag, comm, &answers[size_t(r)]);
  }
  // Per rank: an answer, or a receive that failed (the transport saw the rank die), or none yet.
  enum class Heard { nothing, answer, failure };
  std::vector<Heard> heard(size_t(size), Heard::nothing);
  heard[size_t(rank)] = Heard::answer;
  for (PeerPoll poll;; poll.pause()) {
    answer_probes(comm);
    bool waiting = false;
    for (int r = 0; r < size; ++r) {
      if (heard[size_t(r)] != Heard::nothing) continue;
      int done = 0;
      // A receive the transport ends because the rank died may report success without data:
      // only the answer's byte counts.
      if (MPI_Test(&answers[size_t(r)], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) heard[size_t(r)] = Heard::failure;
      else if (done) heard[size_t(r)] = got[size_t(r)] == kProbeByte ? Heard::answer : Heard::failure;
      else waiting = true;
    }
    if (!waiting || poll.seconds() > kProbeGraceSeconds) break;
  }
  std::vector<int> silent;
  for (int r = 0; r < size; ++r) {
    if (heard[size_t(r)] == Heard::answer) continue;
    silent.push_back(r);
    if (heard[size_t(r)] == Heard::nothing) {
      // A cancelled receive completes without writing, so `got` may go.
      MPI_Cancel(&answers[size_t(r)]);
      MPI_Wait(&answers[size_t(r)], MPI_STATUS_IGNORE);
    }
  }
  return silent;
}

// Who did not answer, in words, for the timeout's message.
std::string silent_ranks_text(MPI_Comm comm, int rank, int size) {
  const std::vector<int> silent = silent_ranks(comm, rank, size);
  if (silent.empty())
    return "every rank answered a check of who is still there, so one is far behind or waits on "
           "another";
  return fmt::format("rank{} {} did not answer a check of who is still there (stopped, dead or far "
                     "behind)", silent.size() > 1 ? "s" : "", fmt::join(silent, ", "));
}

// Completes requests, polling as PeerPoll says (parallel/peer_wait.h) and answering other
// ranks' probes meanwhile. A wait longer than `timeout` seconds is an error naming this rank,
// what it waited for and the ranks that no longer answer.
void wait_all(std::vector<MPI_Request>& reqs, MPI_Status* status, MPI_Comm comm, int rank, int size,
              double timeout, const std::function<std::string()>& what) {
  for (PeerPoll poll;; poll.pause()) {
    int done = 0;
    mpi_check(MPI_Testall(int(reqs.size()), reqs.data(), &done, status), "MPI_Testall");
    if (done) return;
    answer_probes(comm);
    if (poll.seconds() > timeout)
      throw Error(fmt::format("rank {}: no answer within {:.0f} s while waiting for {} "
                              "(parallel.timeout_s): {}",
                              rank, timeout, what(), silent_ranks_text(comm, rank, size)));
  }
}

class MpiExchange final : public PendingExchange {
 public:
  MpiExchange(std::vector<Transfer> transfers, MPI_Comm comm, int rank, int size, double timeout)
      : transfers_(std::move(transfers)), comm_(comm), rank_(rank), size_(size), timeout_(timeout) {
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
    wait_all(requests_, status.data(), comm_, rank_, size_, timeout_, [&] {
      // One entry per peer and direction: a ring step posts several transfers to one peer.
      std::set<std::pair<int, bool>> open;
      for (size_t i = 0; i < transfers_.size(); ++i)
        if (requests_[i] != MPI_REQUEST_NULL) open.insert({transfers_[i].peer, transfers_[i].kind == Transfer::Send});
      std::vector<std::string> peers;
      for (const auto& [peer, send] : open)
        peers.push_back(fmt::format("{} rank {}", send ? "a send to" : "a receive from", peer));
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
  MPI_Comm comm_;
  int rank_, size_;
  double timeout_;
  bool done_ = false;
};

// Reductions in flight (start_all_reduce, start_reduce): one request per slice of the buffer.
class MpiCollective final : public PendingExchange {
 public:
  MpiCollective(std::vector<MPI_Request> requests, MPI_Comm comm, int rank, int size, double timeout)
      : requests_(std::move(requests)), comm_(comm), rank_(rank), size_(size), timeout_(timeout) {}
  ~MpiCollective() override {
    // As MpiExchange: never wait on a dead peer while an error unwinds.
    if (!done_ && std::uncaught_exceptions() == 0)
      MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    if (done_) return;
    wait_all(requests_, MPI_STATUSES_IGNORE, comm_, rank_, size_, timeout_,
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
  MPI_Comm comm_;
  int rank_, size_;
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
    return std::make_unique<MpiCollective>(std::move(r), comm_, rank_, size_, timeout_);
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
    return std::make_unique<MpiCollective>(std::move(r), comm_, rank_, size_, timeout_);
  }
  std::unique_ptr<PendingExchange> start_broadcast(void* buf, int64_t count, DataType type, int root) override {
    DHP_CHECK(root >= 0 && root < size_, "broadcast from rank {} in a world of {}", root, size_);
    const size_t es = data_type_size(type);
    std::vector<MPI_Request> r;
    for (int64_t off = 0; size_ > 1 && off < count; off += kSlice) {
      const int n = int(std::min(kSlice, count - off));
      r.push_back(MPI_REQUEST_NULL);
      mpi_check(MPI_Ibcast(static_cast<char*>(buf) + size_t(off) * es, n, mpi_type(type), root, comm_, &r.back()),
                "MPI_Ibcast");
    }
    return std::make_unique<MpiCollective>(std::move(r), comm_, rank_, size_, timeout_);
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DataType type) override {
    // MPI forbids a receive buffer inside the send buffer: the in-place form (recv is this
    // rank's block of send) receives into a block-sized temporary.
    const size_t bytes = size_t(count) * data_type_size(type);
    const bool in_place = recv == static_cast<const char*>(send) + size_t(rank_) * bytes;
    std::vector<char> staged(in_place ? bytes : 0);
    std::vector<MPI_Request> r(1);
    mpi_check(MPI_Ireduce_scatter_block(send, in_place ? staged.data() : recv, checked_count(count, "reduce_scatter"),
                                        reduce_type(type), MPI_SUM, comm_, &r[0]),
              "MPI_Ireduce_scatter_block");
    finish(r, "a reduce-scatter");
    if (in_place && bytes) std::memcpy(recv, staged.data(), bytes);
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
    return std::make_unique<MpiExchange>(transfers, comm_, rank_, size_, timeout_);
  }

 private:
  void finish(std::vector<MPI_Request>& r, const char* what) {
    wait_all(r, MPI_STATUSES_IGNORE, comm_, rank_, size_, timeout_,
             [what] { return fmt::format("{} with every rank", what); });
  }
  MPI_Comm comm_ = MPI_COMM_NULL;
  int created_ = 0;
  double timeout_ = kDefaultTimeoutSeconds;
  int rank_ = 0, size_ = 1;
};

}  // namespace

#endif

namespace {

// The variables by which an MPI launcher hands a process its place in the job: mpirun (Open
// MPI), a PMIx server (Open MPI 5, `srun --mpi=pmix`), PMI-1/2 (MPICH's Hydra, Intel MPI,
// `srun --mpi=pmi2`).
constexpr const char* kMpiLauncherVars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};

// Launchers that tell a process it is one of N ranks without giving it an MPI world: torchrun
// (and launchers of its kind), and Slurm's srun without an MPI plugin (no --mpi=pmix or pmi2,
// and no MpiDefault in slurm.conf). Alone, each of the N copies would train the whole job.
struct NonMpiLauncher {
  const char* size_var;
  const char* rank_var;
  const char* whose;
};
constexpr NonMpiLauncher kNonMpiLaunchers[] = {
    {"WORLD_SIZE", "RANK", "torchrun's variables"},
    // The step's task count (srun sets it; a batch script's own process has none), not
    // SLURM_NTASKS, which a batch script sees for the whole allocation.
    {"SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "srun without an MPI plugin"},
};

// Refused at once, saying how dhp is launched.
void refuse_a_world_without_mpi() {
  for (const NonMpiLauncher& l : kNonMpiLaunchers) {
    const char* world = std::getenv(l.size_var);
    if (!world || std::string(world).empty() || std::string(world) == "1") continue;
    const char* rank = std::getenv(l.rank_var);
    throw Error(fmt::format(
        "this process was started as rank {} of {}={} ({}), but not by an MPI launcher: dhp's ranks are "
        "MPI processes, and alone this one would train the whole job by itself. Launch with `mpirun -np {} "
        "dhp train ...` (a hostfile for several nodes) or `srun --mpi=pmix dhp train ...` under Slurm",
        rank ? rank : "?", l.size_var, world, l.whose, world));
  }
}

// The first of the launcher's variables that is set, or nullptr.
const char* launcher_variable() {
  for (const char* v : kMpiLauncherVars)
    if (std::getenv(v)) return v;
  return nullptr;
}

}  // namespace

bool started_by_an_mpi_launcher() { return launcher_variable() != nullptr; }

// A process no MPI launcher started is a world of one without MPI at all: Open MPI would
// otherwise start a daemon for it (a singleton MPI_Init costs 0.45 s; single-process runs and
// the tests start dhp hundreds of times).
std::unique_ptr<Communicator> start_world(int* argc, char*** argv) {
  if (!started_by_an_mpi_launcher()) {
    refuse_a_world_without_mpi();
    return std::make_unique<ThreadedCommunicator>(std::make_shared<ThreadedWorld>(1), 0);
  }
#ifdef DHP_MPI
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    mpi_check(MPI_Init(argc, argv), "MPI_Init");
    // MPI can be initialised once per process, so it is finalised at exit rather than when
    // the communicator goes: a later run in the same process (tests) still works.
    std::atexit(finalize_at_exit);
  }
  return std::make_unique<MpiCommunicator>();
#else
  (void)argc, (void)argv;
  throw Error(fmt::format("this process was started by an MPI launcher ({} is set), but this dhp was built "
                          "without MPI (DHP_MPI off): each rank would train the whole job by itself",
                          launcher_variable()));
#endif
}

}  // namespace dhp
