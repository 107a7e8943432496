// The MPI communicator against the same serial computations as the threaded one; ctest runs
// it under mpirun with 3 ranks (and it also runs as a singleton world of one).
#include <gtest/gtest.h>

#include <vector>

#include "parallel/mpi_comm.h"
#include "tests/comm_checks.h"

namespace dhp {
namespace {

Communicator* g_world = nullptr;  // the process's world, set up by main() before any test

TEST(MpiComm, CollectivesMatchSerialResults) {
  for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000)})
    EXPECT_NO_THROW(testing::check_collectives(*g_world, count)) << "count " << count;
}

TEST(MpiComm, GroupedSendsAndReceivesMatchSerialResults) {
  EXPECT_NO_THROW(testing::check_exchanges(*g_world));
}

// Reductions started without waiting (the optimizer's gradient buckets) complete in the
// background while the rank exchanges with its neighbours, with the blocking results.
TEST(MpiComm, OverlappedReductionsMatchBlockingOnes) {
  Communicator& c = *g_world;
  ASSERT_TRUE(c.overlapping_collectives());
  const int n = c.size(), me = c.rank();
  auto values = [&](int r, int salt) {
    std::vector<float> v(301);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float((r + 1) * (salt + 3)) + 0.25f * float(i % 7);
    return v;
  };
  std::vector<float> sum = values(me, 0), onto = values(me, 1), mine_onto = onto;
  auto a = c.start_all_reduce(sum.data(), int64_t(sum.size()), DataType::F32, ReduceOp::Sum);
  const int root = n - 1;
  auto b = c.start_reduce(onto.data(), int64_t(onto.size()), DataType::F32, root);
  // ZeRO-3's layer gathers: bf16 words broadcast from their owner, bits as they are.
  std::vector<uint16_t> cast(257);
  for (size_t i = 0; i < cast.size(); ++i) cast[i] = me == 1 % n ? uint16_t(0x8000u + 37u * i) : 0;
  auto d = c.start_broadcast(cast.data(), int64_t(cast.size()), DataType::BF16, 1 % n);
  // Meanwhile a ring exchange with the neighbours, as ring attention does mid-backward.
  int32_t out = me, in = -1;
  c.exchange({Transfer::send((me + 1) % n, &out, 1), Transfer::recv((me + n - 1) % n, &in, 1)})->wait();
  EXPECT_EQ(in, (me + n - 1) % n);
  a->wait();
  b->wait();
  d->wait();
  EXPECT_TRUE(a->test());
  for (size_t i = 0; i < cast.size(); ++i) ASSERT_EQ(cast[i], uint16_t(0x8000u + 37u * i)) << i;
  std::vector<float> want_sum(sum.size(), 0.0f), want_onto(onto.size(), 0.0f);
  for (int r = 0; r < n; ++r) {
    const auto x = values(r, 0), y = values(r, 1);
    for (size_t i = 0; i < x.size(); ++i) want_sum[i] += x[i], want_onto[i] += y[i];
  }
  for (size_t i = 0; i < sum.size(); ++i) {
    EXPECT_FLOAT_EQ(sum[i], want_sum[i]) << i;
    // The root holds the sum; the others keep what they had.
    EXPECT_FLOAT_EQ(onto[i], me == root ? want_onto[i] : mine_onto[i]) << i;
  }
}

TEST(MpiComm, TheWorldIsTheOnlyCommunicator) {
  testing::check_exchanges(*g_world);
  EXPECT_EQ(g_world->communicators_created(), 1);
}

}  // namespace
}  // namespace dhp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = dhp::start_world(&argc, &argv);
  dhp::g_world = world.get();
  return RUN_ALL_TESTS();
}
