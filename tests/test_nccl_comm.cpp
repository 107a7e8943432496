// The NCCL communicator against the same serial computations as the threaded and MPI ones
// (tests/comm_checks.h), on N threads of one process with one device each; N ranks need N
// devices, so larger N skip on a one-GPU machine. The checks hand it host vectors: a small
// adapter stages them through device buffers, so every call reaches NCCL. Without a usable
// device every device test skips; the type mapping runs anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/cuda/check.h"
#include "parallel/nccl_comm.h"
#include "parallel/threaded_comm.h"
#include "tests/comm_checks.h"
#include "tests/error_of.h"

namespace dhp {
namespace {

using testing::error_of;

int usable_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define SKIP_UNLESS_DEVICES(n)                                                      \
  do {                                                                              \
    const int have_ = usable_devices();                                             \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << have_; \
  } while (0)

// One device allocation of the test (ops never allocate; tests may).
class DeviceCopy {
 public:
  DeviceCopy(const void* host, size_t bytes) : bytes_(bytes) {
    DHP_CUDA_CHECK(cudaMalloc(&dev_, std::max<size_t>(bytes, 1)));
    if (host && bytes) DHP_CUDA_CHECK(cudaMemcpy(dev_, host, bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceCopy() { cudaFree(dev_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  void* get() const { return dev_; }
  void copy_back(void* host) const {
    if (bytes_) DHP_CUDA_CHECK(cudaMemcpy(host, dev_, bytes_, cudaMemcpyDeviceToHost));
  }

 private:
  size_t bytes_;
  void* dev_ = nullptr;
};

// Host buffers in, device buffers to NCCL, results copied back: the shared checks, unchanged.
class Staged final : public Communicator {
 public:
  explicit Staged(NcclCommunicator& inner) : c_(inner) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  std::string name() const override { return "staged " + c_.name(); }
  int communicators_created() const override { return c_.communicators_created(); }
  void set_timeout(double seconds) override { c_.set_timeout(seconds); }
  void abort(const std::string& why) override { c_.abort(why); }

  void all_reduce(void* buf, int64_t count, DataType type, ReduceOp op) override {
    DeviceCopy d(buf, bytes(count, type));
    c_.all_reduce(d.get(), count, type, op);
    d.copy_back(buf);
  }
  void reduce_scatter(const void* send, void* recv, int64_t count, DataType type) override {
    DeviceCopy s(send, bytes(count * size(), type)), r(nullptr, bytes(count, type));
    c_.reduce_scatter(s.get(), r.get(), count, type);
    r.copy_back(recv);
  }
  void all_gather(const void* send, void* recv, int64_t count, DataType type) override {
    DeviceCopy s(send, bytes(count, type)), r(nullptr, bytes(count * size(), type));
    c_.all_gather(s.get(), r.get(), count, type);
    r.copy_back(recv);
  }
  void broadcast(void* buf, int64_t count, DataType type, int root) override {
    DeviceCopy d(buf, bytes(count, type));
    c_.broadcast(d.get(), count, type, root);
    d.copy_back(buf);
  }
  void barrier() override { c_.barrier(); }

  std::unique_ptr<PendingExchange> exchange(const std::vector<Transfer>& transfers) override {
    auto staged = std::make_unique<StagedExchange>();
    std::vector<Transfer> dev = transfers;
    for (size_t i = 0; i < transfers.size(); ++i) {
      const Transfer& t = transfers[i];
      staged->copies.push_back(std::make_unique<DeviceCopy>(
          t.kind == Transfer::Send ? t.buf : nullptr, bytes(t.count, t.type)));
      dev[i].buf = staged->copies.back()->get();
      if (t.kind == Transfer::Recv) staged->back.emplace_back(staged->copies.back().get(), t.buf);
    }
    staged->inner = c_.exchange(dev);
    return staged;
  }

 private:
  struct StagedExchange final : PendingExchange {
    std::vector<std::unique_ptr<DeviceCopy>> copies;
    std::vector<std::pair<DeviceCopy*, void*>> back;  // receive: device copy -> host buffer
    std::unique_ptr<PendingExchange> inner;
    void wait() override {
      inner->wait();
      for (auto& [d, host] : back) d->copy_back(host);
    }
  };
  static size_t bytes(int64_t count, DataType t) { return size_t(count) * data_type_size(t); }
  NcclCommunicator& c_;
};

// fn(nccl) on n threads, thread r on device r.
void run_nccl(int n, const std::function<void(NcclCommunicator&)>& fn) {
  run_threaded(n, [&](Communicator& boot) {
    DHP_CUDA_CHECK(cudaSetDevice(boot.rank()));
    NcclCommunicator nccl(boot);
    // Both made at start-up: blocking calls and exchanges, and the overlapped reductions.
    DHP_CHECK(nccl.communicators_created() == 2, "rank {}: {} communicators created", boot.rank(),
              nccl.communicators_created());
    fn(nccl);
  });
}

TEST(NcclTypes, EveryDataTypeAndReductionHasItsNcclCounterpart) {
  EXPECT_EQ(nccl_type(DataType::F32), ncclFloat32);
  EXPECT_EQ(nccl_type(DataType::F64), ncclFloat64);
  EXPECT_EQ(nccl_type(DataType::I32), ncclInt32);
  EXPECT_EQ(nccl_type(DataType::I64), ncclInt64);
  EXPECT_EQ(nccl_type(DataType::U8), ncclUint8);
  EXPECT_EQ(nccl_op(ReduceOp::Sum), ncclSum);
  EXPECT_EQ(nccl_op(ReduceOp::Max), ncclMax);
}

class NcclComm : public ::testing::TestWithParam<int> {};

TEST_P(NcclComm, CollectivesMatchSerialResults) {
  SKIP_UNLESS_DEVICES(GetParam());
  for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000), int64_t(1) << 20})
    EXPECT_NO_THROW(run_nccl(GetParam(), [&](NcclCommunicator& c) {
      Staged s(c);
      testing::check_collectives(s, count);
    })) << "count " << count;
}

TEST_P(NcclComm, GroupedSendsAndReceivesMatchSerialResults) {
  SKIP_UNLESS_DEVICES(GetParam());
  EXPECT_NO_THROW(run_nccl(GetParam(), [](NcclCommunicator& c) {
    Staged s(c);
    testing::check_exchanges(s);
  }));
}

TEST_P(NcclComm, HostBuffersGoToTheBootstrapAndMixedOnesAreAnError) {
  SKIP_UNLESS_DEVICES(GetParam());
  const int N = GetParam();
  EXPECT_NO_THROW(run_nccl(N, [&](NcclCommunicator& c) {
    double sums[2] = {double(c.rank()), 1.0};
    c.all_reduce_sum(sums, 2);
    DHP_CHECK(sums[0] == N * (N - 1) / 2.0 && sums[1] == N, "host all_reduce: {} {}", sums[0], sums[1]);
    std::vector<float> host(4, 1.0f);
    DeviceCopy dev(host.data(), sizeof(float) * host.size());
    const std::string msg = error_of([&] {
      c.all_gather(host.data(), dev.get(), 4 / N, DataType::F32);
    });
    DHP_CHECK(msg.find("mixes host and device buffers") != std::string::npos, "got '{}'", msg);
  }));
}

// The optimizer's gradient buckets: reductions started without waiting, on their own
// communicator and stream, complete while the ranks exchange on the first, with the sums a
// blocking call gives.
TEST_P(NcclComm, OverlappedReductionsMatchBlockingOnes) {
  SKIP_UNLESS_DEVICES(GetParam());
  const int N = GetParam();
  EXPECT_NO_THROW(run_nccl(N, [&](NcclCommunicator& c) {
    DHP_CHECK(c.overlapping_collectives(), "NCCL should overlap");
    const int me = c.rank();
    auto values = [](int r, int salt) {
      std::vector<float> v(1001);
      for (size_t i = 0; i < v.size(); ++i) v[i] = float((r + 1) * (salt + 3)) + 0.25f * float(i % 7);
      return v;
    };
    const std::vector<float> mine_sum = values(me, 0), mine_onto = values(me, 1);
    DeviceCopy sum(mine_sum.data(), sizeof(float) * mine_sum.size());
    DeviceCopy onto(mine_onto.data(), sizeof(float) * mine_onto.size());
    const int root = N - 1;
    auto a = c.start_all_reduce(sum.get(), int64_t(mine_sum.size()), DataType::F32, ReduceOp::Sum);
    auto b = c.start_reduce(onto.get(), int64_t(mine_onto.size()), DataType::F32, root);
    // ZeRO-3's layer gathers: a broadcast from the owner.
    std::vector<float> mine_cast(513);
    for (size_t i = 0; i < mine_cast.size(); ++i) mine_cast[i] = me == 0 ? 0.5f * float(i) - 7.0f : 0.0f;
    DeviceCopy cast(mine_cast.data(), sizeof(float) * mine_cast.size());
    auto d = c.start_broadcast(cast.get(), int64_t(mine_cast.size()), DataType::F32, 0);
    // Meanwhile a ring exchange on the first communicator, as ring attention does.
    const int32_t out = me;
    DeviceCopy send(&out, sizeof(out)), recv(nullptr, sizeof(int32_t));
    c.exchange({Transfer::send((me + 1) % N, static_cast<const int32_t*>(send.get()), 1),
                Transfer::recv((me + N - 1) % N, static_cast<int32_t*>(recv.get()), 1)})
        ->wait();
    int32_t in = -1;
    recv.copy_back(&in);
    DHP_CHECK(in == (me + N - 1) % N, "rank {} received {}", me, in);
    a->wait();
    b->wait();
    d->wait();
    std::vector<float> got_cast(mine_cast.size());
    cast.copy_back(got_cast.data());
    for (size_t i = 0; i < got_cast.size(); ++i)
      DHP_CHECK(got_cast[i] == 0.5f * float(i) - 7.0f, "rank {} broadcast element {}: {}", me, i, got_cast[i]);
    std::vector<float> got_sum(mine_sum.size()), got_onto(mine_onto.size());
    sum.copy_back(got_sum.data());
    onto.copy_back(got_onto.data());
    for (size_t i = 0; i < got_sum.size(); ++i) {
      float want_sum = 0.0f, want_onto = 0.0f;
      for (int r = 0; r < N; ++r) want_sum += values(r, 0)[i], want_onto += values(r, 1)[i];
      DHP_CHECK(std::abs(got_sum[i] - want_sum) <= 1e-5f * std::abs(want_sum),
                "rank {} all-reduce element {}: {} != {}", me, i, got_sum[i], want_sum);
      // The root holds the sum; the others keep what they had.
      const float want = me == root ? want_onto : mine_onto[i];
      DHP_CHECK(std::abs(got_onto[i] - want) <= 1e-5f * std::abs(want),
                "rank {} reduce element {}: {} != {}", me, i, got_onto[i], want);
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclComm, ::testing::Values(1, 2, 4, 8));

TEST(NcclCommFailures, ARankThatNeverArrivesIsNamedAfterTheTimeout) {
  SKIP_UNLESS_DEVICES(2);
  const std::string msg = error_of([] {
    run_nccl(2, [](NcclCommunicator& c) {
      c.set_timeout(1.0);
      if (c.rank() == 1) return;  // gone without a word
      DeviceCopy d(nullptr, sizeof(float) * 16);
      c.all_reduce(d.get(), 16, DataType::F32, ReduceOp::Sum);
    });
  });
  // The peer's departure may also surface as an NCCL error before the timeout: either way the
  // message names the waiting rank and the call.
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("an all-reduce (sum) of 16 x f32"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dhp
