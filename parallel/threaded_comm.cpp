#include "parallel/threaded_comm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "core/check.h"

namespace dhp {

size_t data_type_size(DataType t) {
  switch (t) {
    case DataType::F32: return 4;
    case DataType::F64: return 8;
    case DataType::I32: return 4;
    case DataType::I64: return 8;
    case DataType::U8: return 1;
    case DataType::BF16: return 2;
  }
  return 0;
}

const char* data_type_name(DataType t) {
  switch (t) {
    case DataType::F32: return "f32";
    case DataType::F64: return "f64";
    case DataType::I32: return "i32";
    case DataType::I64: return "i64";
    case DataType::U8: return "u8";
    case DataType::BF16: return "bf16";
  }
  return "?";
}

std::unique_ptr<PendingExchange> Communicator::start_all_reduce(void*, int64_t count, DataType type,
                                                              ReduceOp) {
  throw Error(fmt::format("the {} communicator cannot overlap an all-reduce ({} x {}) with other "
                          "work; reduce after the backward pass instead",
                          name(), count, data_type_name(type)));
}

std::unique_ptr<PendingExchange> Communicator::start_reduce(void*, int64_t count, DataType type,
                                                          int root) {
  throw Error(fmt::format("the {} communicator cannot overlap a reduce ({} x {} onto rank {}) "
                          "with other work; reduce after the backward pass instead",
                          name(), count, data_type_name(type), root));
}

std::unique_ptr<PendingExchange> Communicator::start_broadcast(void*, int64_t count, DataType type, int root) {
  throw Error(fmt::format("the {} communicator cannot overlap a broadcast ({} x {} from rank {}) with other work",
                          name(), count, data_type_name(type), root));
}

namespace {

template <class T>
void reduce_typed(void* out, const std::vector<const void*>& in, int64_t offset, int64_t count,
                  ReduceOp op) {
  T* o = static_cast<T*>(out);
  for (int64_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(in[0])[offset + i];
    for (size_t r = 1; r < in.size(); ++r) {
      const T x = static_cast<const T*>(in[r])[offset + i];
      acc = op == ReduceOp::Sum ? T(acc + x) : std::max(acc, x);
    }
    o[i] = acc;
  }
}

// out[i] = in_0[offset + i] (op) in_1[offset + i] (op) ...: ranks in order, so the rounding of a
// sum depends on the world size only.
void reduce(void* out, const std::vector<const void*>& in, int64_t offset, int64_t count,
            DataType type, ReduceOp op) {
  switch (type) {
    case DataType::F32: return reduce_typed<float>(out, in, offset, count, op);
    case DataType::F64: return reduce_typed<double>(out, in, offset, count, op);
    case DataType::I32: return reduce_typed<int32_t>(out, in, offset, count, op);
    case DataType::I64: return reduce_typed<int64_t>(out, in, offset, count, op);
    case DataType::U8: return reduce_typed<uint8_t>(out, in, offset, count, op);
    case DataType::BF16: break;
  }
  // bf16 activations are moved, never reduced: gradients are summed in fp32.
  throw Error(fmt::format("a reduction of {} is not supported", data_type_name(type)));
}

const char* op_name(ReduceOp op) { return op == ReduceOp::Sum ? "sum" : "max"; }

}  // namespace

ThreadedWorld::ThreadedWorld(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout), calls_(size), arrived_(size, 0) {
  DHP_CHECK(size >= 1, "a world needs at least one rank (got {})", size);
}

void ThreadedWorld::fail(int rank, const std::string& what) {
  std::lock_guard lk(mu_);
  if (!failed_) {
    failed_ = true;
    failure_ = fmt::format("rank {} failed: {}", rank, what);
  }
  cv_.notify_all();
}

bool ThreadedWorld::failed() const {
  std::lock_guard lk(mu_);
  return failed_;
}

std::string ThreadedWorld::failure() const {
  std::lock_guard lk(mu_);
  return failure_;
}

void ThreadedWorld::throw_if_failed_locked() const {
  if (failed_) throw Error(failure_);
}

void ThreadedWorld::arrive(int rank, const std::string& what) {
  std::unique_lock lk(mu_);
  throw_if_failed_locked();
  const uint64_t gen = generation_;
  arrived_[size_t(rank)] = 1;
  if (++waiting_ == size_) {
    waiting_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), 0);
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait_for(lk, timeout_, [&] { return generation_ != gen || failed_; });
  if (generation_ != gen) return;
  throw_if_failed_locked();
  std::vector<int> missing;
  for (int r = 0; r < size_; ++r)
    if (!arrived_[size_t(r)]) missing.push_back(r);
  failed_ = true;
  failure_ = fmt::format("rank {}: rank(s) {} did not reach {} within {:.1f} s", rank,
                         fmt::join(missing, ", "), what, double(timeout_.count()) / 1e3);
  cv_.notify_all();
  throw Error(failure_);
}

void ThreadedWorld::post(int src, int dst, int tag, Message m) {
  std::lock_guard lk(mu_);
  throw_if_failed_locked();
  mail_[{src, dst, tag}].push_back(std::move(m));
  cv_.notify_all();
}

ThreadedWorld::Message ThreadedWorld::take(int src, int dst, int tag, const std::string& what) {
  std::unique_lock lk(mu_);
  auto& box = mail_[{src, dst, tag}];
  cv_.wait_for(lk, timeout_, [&] { return !box.empty() || failed_; });
  throw_if_failed_locked();
  if (box.empty()) {
    failed_ = true;
    failure_ = fmt::format("rank {}: no message from rank {} within {:.1f} s ({})", dst, src,
                           double(timeout_.count()) / 1e3, what);
    cv_.notify_all();
    throw Error(failure_);
  }
  Message m = std::move(box.front());
  box.pop_front();
  return m;
}

const std::vector<ThreadedWorld::Call>& ThreadedCommunicator::meet(ThreadedWorld::Call call) {
  const std::string what = call.what;
  {
    std::lock_guard lk(world_.mu_);
    world_.calls_[size_t(rank_)] = std::move(call);
  }
  world_.arrive(rank_, what);
  // Between this barrier and the next, no rank publishes a new call: reading is safe.
  const auto& calls = world_.calls_;
  for (int r = 0; r < size(); ++r)
    if (calls[size_t(r)].what != what) {
      std::vector<std::string> each;
      for (int k = 0; k < size(); ++k) each.push_back(fmt::format("rank {}: {}", k, calls[size_t(k)].what));
      throw Error(fmt::format("ranks disagree on a collective call ({})", fmt::join(each, "; ")));
    }
  return calls;
}

void ThreadedCommunicator::all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) {
  const auto& calls = meet({fmt::format("all_reduce({} x {}, {})", count, data_type_name(type),
                                        op_name(op)), buf, buf});
  std::vector<const void*> in;
  for (const auto& c : calls) in.push_back(c.send);
  const size_t bytes = size_t(count) * data_type_size(type);
  scratch_.resize(bytes);
  reduce(scratch_.data(), in, 0, count, type, op);
  world_.arrive(rank_, "all_reduce (done)");
  if (bytes) std::memcpy(buf, scratch_.data(), bytes);
}

void ThreadedCommunicator::reduce_scatter(const void* send, void* recv, int64_t count,
                                          DataType type) {
  const auto& calls = meet({fmt::format("reduce_scatter({} x {} per rank)", count,
                                        data_type_name(type)), send, recv});
  std::vector<const void*> in;
  for (const auto& c : calls) in.push_back(c.send);
  // In place (recv is this rank's block of send) as well: each element is read from every rank
  // before it is written, and the other ranks read other blocks of this rank's send.
  reduce(recv, in, int64_t(rank_) * count, count, type, ReduceOp::Sum);
  world_.arrive(rank_, "reduce_scatter (done)");
}

void ThreadedCommunicator::all_gather(const void* send, void* recv, int64_t count,
                                      DataType type) {
  const auto& calls = meet({fmt::format("all_gather({} x {} per rank)", count,
                                        data_type_name(type)), send, recv});
  const size_t bytes = size_t(count) * data_type_size(type);
  for (int r = 0; r < size(); ++r) {
    char* dst = static_cast<char*>(recv) + size_t(r) * bytes;
    // A rank's own block may already be in place (an in-place all-gather).
    if (bytes && dst != calls[size_t(r)].send) std::memcpy(dst, calls[size_t(r)].send, bytes);
  }
  world_.arrive(rank_, "all_gather (done)");
}

void ThreadedCommunicator::broadcast(void* buf, int64_t count, DataType type, int root) {
  DHP_CHECK(root >= 0 && root < size(), "broadcast from rank {} in a world of {}", root, size());
  const auto& calls = meet({fmt::format("broadcast({} x {} from rank {})", count,
                                        data_type_name(type), root), buf, buf});
  const size_t bytes = size_t(count) * data_type_size(type);
  if (rank_ != root && bytes) std::memcpy(buf, calls[size_t(root)].send, bytes);
  world_.arrive(rank_, "broadcast (done)");
}

void ThreadedCommunicator::set_timeout(double seconds) {
  std::lock_guard lk(world_.mu_);
  world_.timeout_ = std::chrono::milliseconds(int64_t(seconds * 1e3));
}

void ThreadedCommunicator::barrier() {
  meet({"barrier", nullptr, nullptr});
  world_.arrive(rank_, "barrier (done)");
}

namespace {

class ThreadedExchange final : public PendingExchange {
 public:
  ThreadedExchange(ThreadedWorld& world, int rank, std::vector<Transfer> recvs,
                   std::function<ThreadedWorld::Message(const Transfer&)> take)
      : world_(world), rank_(rank), recvs_(std::move(recvs)), take_(std::move(take)) {}
  ~ThreadedExchange() override {
    // Leaving receives unmatched would hand their messages to a later receive: a bug, unless
    // the exchange is abandoned because an error is already on its way.
    DHP_ASSERT(done_ || std::uncaught_exceptions() > 0 || world_.failed());
  }
  void wait() override {
    for (; next_ < recvs_.size(); ++next_) {
      const Transfer& t = recvs_[next_];
      ThreadedWorld::Message m = take_(t);
      DHP_CHECK(m.type == t.type && m.count == t.count,
                "rank {} expected {} x {} from rank {} (tag {}), got {} x {}", rank_, t.count,
                data_type_name(t.type), t.peer, t.tag, m.count, data_type_name(m.type));
      if (!m.data.empty()) std::memcpy(t.buf, m.data.data(), m.data.size());
    }
    done_ = true;
  }

 private:
  ThreadedWorld& world_;
  int rank_;
  std::vector<Transfer> recvs_;
  std::function<ThreadedWorld::Message(const Transfer&)> take_;
  size_t next_ = 0;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<PendingExchange> ThreadedCommunicator::exchange(
    const std::vector<Transfer>& transfers) {
  std::vector<Transfer> recvs;
  for (const Transfer& t : transfers) {
    DHP_CHECK(t.peer >= 0 && t.peer < size(), "rank {}: transfer to rank {} in a world of {}",
              rank_, t.peer, size());
    if (t.kind == Transfer::Recv) {
      recvs.push_back(t);
      continue;
    }
    const size_t bytes = size_t(t.count) * data_type_size(t.type);
    ThreadedWorld::Message m{t.type, t.count, std::vector<char>(bytes)};
    if (bytes) std::memcpy(m.data.data(), t.buf, bytes);
    world_.post(rank_, t.peer, t.tag, std::move(m));
  }
  return std::make_unique<ThreadedExchange>(world_, rank_, std::move(recvs), [this](const Transfer& t) {
    return world_.take(t.peer, rank_, t.tag,
                       fmt::format("receive of {} x {}, tag {}", t.count, data_type_name(t.type), t.tag));
  });
}

void run_threaded(int n, const std::function<void(Communicator&)>& fn,
                  std::chrono::milliseconds timeout) {
  auto shared = std::make_shared<ThreadedWorld>(n, timeout);
  ThreadedWorld& world = *shared;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  std::mutex first_mu;
  int first = -1;  // the rank whose failure came first: the others' errors follow from it
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ThreadedCommunicator comm(shared, r);
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors[size_t(r)] = std::current_exception();
        {
          std::lock_guard lk(first_mu);
          if (first < 0) first = r;
        }
        world.fail(r, e.what());
      }
    });
  for (auto& t : threads) t.join();
  if (first < 0) return;
  try {
    std::rethrow_exception(errors[size_t(first)]);
  } catch (const Error& e) {
    // A peer's own error already names the rank; a rank's first failure gets its number.
    const std::string what = e.what();
    throw Error(what.rfind("rank ", 0) == 0 ? what : fmt::format("rank {}: {}", first, what));
  }
}

}  // namespace dhp
