// N ranks as N threads of one process, sharing one ThreadedWorld. Used by the multi-rank tests
// (any N runs in one test process, fast on two cores and under sanitizers) and as the world
// of one when dhp is built without MPI.
//
// Collectives meet at a barrier, then every rank reads the others' buffers directly and
// computes its own result in rank order (deterministic), then meets again before returning so
// no buffer is reused while a peer still reads it. Sends are eager: the data is copied into
// the receiver's mailbox at once, so no pattern of grouped sends and receives can deadlock.
// When a rank fails (run_threaded catches its exception), or a call finds its peers calling a
// different collective, every waiting and later call on every rank throws dhp::Error naming
// the rank and the call; a peer that does not arrive within the timeout is reported likewise.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "parallel/communicator.h"

namespace dhp {

class ThreadedWorld {
 public:
  explicit ThreadedWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  int size() const { return size_; }
  // Marks the world failed; every rank's pending and later calls throw with this message.
  void fail(int rank, const std::string& what);
  bool failed() const;
  std::string failure() const;

  // Internals of the collectives and the mailboxes, used by ThreadedCommunicator.
  struct Call {
    std::string what;  // the collective and its arguments, compared across ranks
    const void* send = nullptr;
    void* recv = nullptr;
  };
  struct Message {
    DataType type;
    int64_t count;
    std::vector<char> data;
  };

 private:
  friend class ThreadedCommunicator;
  // Blocks until every rank has arrived (or throws); `what` names the call for errors.
  void arrive(int rank, const std::string& what);
  void post(int src, int dst, int tag, Message m);
  Message take(int src, int dst, int tag, const std::string& what);
  void throw_if_failed_locked() const;

  const int size_;
  std::chrono::milliseconds timeout_;  // shared by the world's ranks
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  std::vector<char> arrived_;  // per rank, for the current barrier
  int waiting_ = 0;
  uint64_t generation_ = 0;
  bool failed_ = false;
  std::string failure_;
  std::map<std::tuple<int, int, int>, std::deque<Message>> mail_;  // (src, dst, tag)
};

class ThreadedCommunicator final : public Communicator {
 public:
  ThreadedCommunicator(std::shared_ptr<ThreadedWorld> world, int rank)
      : owner_(std::move(world)), world_(*owner_), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  std::string name() const override { return "threaded"; }
  int communicators_created() const override { return 1; }  // the world it was given
  void set_timeout(double seconds) override;

  void all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) override;
  void reduce_scatter(const void* send, void* recv, int64_t count, DataType type) override;
  void all_gather(const void* send, void* recv, int64_t count, DataType type) override;
  void broadcast(void* buf, int64_t count, DataType type, int root) override;
  void barrier() override;
  std::unique_ptr<PendingExchange> exchange(const std::vector<Transfer>& transfers) override;

 private:
  // Publishes this rank's call, waits for all, checks that every rank made the same call.
  const std::vector<ThreadedWorld::Call>& meet(ThreadedWorld::Call call);
  std::shared_ptr<ThreadedWorld> owner_;
  ThreadedWorld& world_;
  const int rank_;
  std::vector<char> scratch_;  // this rank's all_reduce result before it is written back
};

// Runs fn(comm) as ranks 0..n-1 on n threads and returns when all have finished. When any rank
// throws, the world fails (so no other rank waits forever) and the first rank's error is
// rethrown here, as a dhp::Error that names the rank.
void run_threaded(int n, const std::function<void(Communicator&)>& fn,
                  std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dhp
