// The run's one global communicator (design.md §3). Groups formed by the planner are logical
// rank lists inside it: ring attention sends and receives between group neighbours by world
// rank, so re-forming groups every step creates no communicator.
//
// Buffers are device buffers of the backend the run uses. Implementations: MPI across
// processes (parallel/mpi_comm.h), and N threads of one process as N ranks
// (parallel/threaded_comm.h) for fast multi-rank tests of any N; NCCL comes with the CUDA
// backend. Every blocking call either completes or throws dhp::Error: a failed or mismatched
// peer never leaves the others waiting forever.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/op_types.h"

namespace dhp {

class Backend;

// BF16 moves activations stored in bf16 (Ops::dtype); it is never reduced.
enum class DataType { F32, F64, I32, I64, U8, BF16 };
size_t data_type_size(DataType t);
const char* data_type_name(DataType t);

template <class T>
constexpr DataType data_type_of();
template <> constexpr DataType data_type_of<float>() { return DataType::F32; }
template <> constexpr DataType data_type_of<double>() { return DataType::F64; }
template <> constexpr DataType data_type_of<int32_t>() { return DataType::I32; }
template <> constexpr DataType data_type_of<int64_t>() { return DataType::I64; }
template <> constexpr DataType data_type_of<uint8_t>() { return DataType::U8; }
constexpr DataType data_type_of(DType t) { return t == DType::BF16 ? DataType::BF16 : DataType::F32; }

enum class ReduceOp { Sum, Max };

// How long one blocking call may wait for its peers before it is an error (parallel.timeout_s).
inline constexpr double kDefaultTimeoutSeconds = 60.0;

// One send or receive of a grouped exchange. A receive must name the exact count and type the
// peer sends under the same tag; anything else is an error on the receiving rank.
struct Transfer {
  enum Kind { Send, Recv };
  Kind kind;
  int peer;       // world rank
  void* buf;      // read by a send, written by a receive
  int64_t count;  // elements
  DataType type;
  int tag = 0;

  template <class T>
  static Transfer send(int peer, const T* buf, int64_t count, int tag = 0) {
    return {Send, peer, const_cast<T*>(buf), count, data_type_of<T>(), tag};
  }
  template <class T>
  static Transfer recv(int peer, T* buf, int64_t count, int tag = 0) {
    return {Recv, peer, buf, count, data_type_of<T>(), tag};
  }
  // Activations in the backend's storage dtype.
  static Transfer send(int peer, CAct buf, int64_t count, int tag = 0) {
    return {Send, peer, const_cast<void*>(buf.p), count, data_type_of(buf.t), tag};
  }
  static Transfer recv(int peer, Act buf, int64_t count, int tag = 0) {
    return {Recv, peer, buf.p, count, data_type_of(buf.t), tag};
  }
};

// Transfers in flight. wait() returns when every one of them has completed: send buffers may
// be reused and receive buffers hold their data. Destroying an unwaited exchange waits.
class PendingExchange {
 public:
  virtual ~PendingExchange() = default;
  virtual void wait() = 0;
  // Lets the transport move the transfers along without waiting (MPI progresses a request
  // only inside MPI calls); true once they have completed. wait() is still required.
  virtual bool test() { return false; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  // Communicators this object has created with the transport (the world's own counts one).
  // Groups are rank lists on this one communicator, so the count never grows after start-up.
  virtual int communicators_created() const = 0;
  // The longest a blocking call waits for its peers before throwing dhp::Error that names
  // this rank and what it waited for: a dead or stopped rank never hangs the job.
  virtual void set_timeout(double seconds) = 0;
  // Ends every rank of the job after this rank met an error it reported: the others would
  // otherwise wait for it (MPI: MPI_Abort, which does not return).
  virtual void abort(const std::string& why) = 0;

  // Collectives over every rank; every rank calls them in the same order with the same count,
  // type and root. Reductions run in an order fixed for a given world size, so a run is
  // reproducible.
  virtual void all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) = 0;  // in place
  // send (size()·count) -> recv (count): rank r receives the sum over ranks of block r. recv
  // may be send's own block r (send + r·count): the sum then replaces it in place, and the
  // other blocks of send are left undefined.
  virtual void reduce_scatter(const void* send, void* recv, int64_t count, DataType type) = 0;
  // send (count) -> recv (size()·count): block r is rank r's send.
  virtual void all_gather(const void* send, void* recv, int64_t count, DataType type) = 0;
  virtual void broadcast(void* buf, int64_t count, DataType type, int root) = 0;
  virtual void barrier() = 0;

  // Device communicators order every transfer after the work `backend` has queued so far on
  // its stream (NCCL runs on a stream of its own, so ring transfers overlap compute); host
  // communicators have nothing to order. Called once the backend exists.
  virtual void follow(Backend& backend) { (void)backend; }

  // Whether start_all_reduce overlaps: the collective then completes in the background while
  // the rank computes and talks to its ring neighbours. A communicator without it would block
  // in start_all_reduce, and a rank blocked there mid-backward would stall its ring partners,
  // so callers overlap only where this is true.
  virtual bool overlapping_collectives() const { return false; }
  // Starts an in-place all-reduce and returns at once; `buf` must stay untouched until the
  // returned exchange's wait(). Every rank starts the same collectives in the same order.
  // Throws dhp::Error where overlapping_collectives() is false.
  virtual std::unique_ptr<PendingExchange> start_all_reduce(void* buf, int64_t count,
                                                            DataType type, ReduceOp op);
  // Starts an in-place sum onto `root`: root's buf receives the sum over ranks; the other
  // ranks' buf is left as it was. As start_all_reduce otherwise.
  virtual std::unique_ptr<PendingExchange> start_reduce(void* buf, int64_t count, DataType type,
                                                        int root);
  // Starts a broadcast of root's buf into every rank's; as start_all_reduce otherwise.
  virtual std::unique_ptr<PendingExchange> start_broadcast(void* buf, int64_t count, DataType type, int root);

  // Starts sends and receives to any ranks of the world, returns at once. Sends are matched to
  // receives by (source, destination, tag) in the order they were posted.
  virtual std::unique_ptr<PendingExchange> exchange(const std::vector<Transfer>& transfers) = 0;

  template <class T>
  void all_reduce_sum(T* buf, int64_t count) {
    all_reduce(buf, count, data_type_of<T>(), ReduceOp::Sum);
  }
  template <class T>
  void all_reduce_max(T* buf, int64_t count) {
    all_reduce(buf, count, data_type_of<T>(), ReduceOp::Max);
  }
};

}  // namespace dhp
