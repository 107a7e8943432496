// The threaded communicator (N ranks as N threads) against plain serial computations for
// N = 1..8, and its failure behaviour: mismatched calls, a rank that throws, a rank that never
// arrives and a receive nobody sends to all end in errors on every rank, never in a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "parallel/exchange_order.h"
#include "parallel/placement.h"
#include "parallel/threaded_comm.h"
#include "tests/comm_checks.h"
#include "tests/error_of.h"

namespace dhp {
namespace {

using namespace std::chrono_literals;
using testing::error_of;

class ThreadedComm : public ::testing::TestWithParam<int> {};

TEST_P(ThreadedComm, CollectivesMatchSerialResults) {
  for (int64_t count : {int64_t(1), int64_t(7), int64_t(1000)})
    EXPECT_NO_THROW(run_threaded(GetParam(), [&](Communicator& c) {
      testing::check_collectives(c, count);
    })) << "count " << count;
}

TEST_P(ThreadedComm, GroupedSendsAndReceivesMatchSerialResults) {
  EXPECT_NO_THROW(run_threaded(GetParam(), [](Communicator& c) { testing::check_exchanges(c); }));
}

TEST_P(ThreadedComm, ManyBackToBackCollectivesStayInStep) {
  // Fast ranks start the next collective while slow ones still read the previous one's
  // buffers; the results must not mix.
  const int N = GetParam();
  EXPECT_NO_THROW(run_threaded(N, [&](Communicator& c) {
    for (int it = 0; it < 200; ++it) {
      std::vector<int64_t> v{int64_t(c.rank()) + it, 1};
      c.all_reduce_sum(v.data(), 2);
      DHP_CHECK(v[0] == int64_t(N) * (N - 1) / 2 + int64_t(N) * it && v[1] == N,
                "iteration {}: got {} {}", it, v[0], v[1]);
      std::vector<int32_t> g(N);
      const int32_t mine = c.rank() * it;
      c.all_gather(&mine, g.data(), 1, DataType::I32);
      for (int q = 0; q < N; ++q) DHP_CHECK(g[q] == q * it, "all_gather iteration {}", it);
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadedComm, ::testing::Range(1, 9));

// Transports without tags (NCCL) post each peer's messages by ascending tag, so order matching
// pairs what tag matching pairs.
// The planner's nodes come from where the ranks run: threads of one process share a host;
// DHP_NODE_SIZE makes every k consecutive ranks a node (how the MPI tests make 4 ranks 2
// nodes of 2 on one machine).
bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::vector<Placement> placements(int n, const char* node_size) {
  if (node_size) ::setenv("DHP_NODE_SIZE", node_size, 1);
  std::vector<Placement> out(static_cast<size_t>(n));
  std::string error;
  try {
    run_threaded(n, [&](Communicator& c) { out[size_t(c.rank())] = detect_placement(c); });
  } catch (const Error& e) {
    error = e.what();
  }
  ::unsetenv("DHP_NODE_SIZE");
  if (!error.empty()) throw Error(error);
  return out;
}

TEST(Placement, FoundFromTheHostOrDhpNodeSize) {
  for (const Placement& p : placements(4, nullptr)) {
    EXPECT_EQ(p.node_of_rank, (std::vector<int>{0, 0, 0, 0}));
    EXPECT_EQ(p.ranks_per_node(), 4);
  }
  for (const Placement& p : placements(4, "2")) {
    EXPECT_EQ(p.node_of_rank, (std::vector<int>{0, 0, 1, 1}));
    EXPECT_EQ(p.ranks_per_node(), 2);
    EXPECT_EQ(resolve_ranks_per_node(0, p), 2);
    EXPECT_EQ(resolve_ranks_per_node(2, p), 2);
  }
  EXPECT_EQ(placements(5, "3")[0].ranks_per_node(), 0);  // 3 + 2: uneven
  EXPECT_TRUE(has(error_of([] { placements(2, "two"); }), "DHP_NODE_SIZE='two'"));
}

TEST(Placement, AStatedValueThatDisagreesAndPlacementsThePlannerCannotDescribeAreRefused) {
  Placement p{{0, 0, 1, 1}, "test"};
  const std::string wrong = error_of([&] { resolve_ranks_per_node(4, p); });
  for (const char* part : {"parallel.ranks_per_node = 4", "placed 2 ranks on each of 2 node(s)"})
    EXPECT_TRUE(has(wrong, part)) << wrong;
  // Round robin (--map-by node): node 0 holds ranks 0 and 2.
  const std::string rr = error_of([] { resolve_ranks_per_node(0, Placement{{0, 1, 0, 1}, "test"}); });
  for (const char* part : {"node 0: ranks 0,2", "node 1: ranks 1,3", "--map-by ppr:N:node"})
    EXPECT_TRUE(has(rr, part)) << rr;
  const std::string uneven = error_of([] { resolve_ranks_per_node(0, Placement{{0, 0, 0, 1, 1}, "test"}); });
  EXPECT_TRUE(has(uneven, "node 0: ranks 0-2; node 1: ranks 3,4")) << uneven;
}

TEST(ExchangeOrder, EachPeersTransfersGoByTagKeepingTheirSlotsAndTheOrderWithinATag) {
  float x[8] = {};
  const std::vector<Transfer> t{
      Transfer::send(1, x + 0, 1, 5), Transfer::recv(1, x + 1, 1, 2), Transfer::send(2, x + 2, 1, 9),
      Transfer::send(1, x + 3, 1, 2), Transfer::recv(1, x + 4, 1, 1), Transfer::send(1, x + 5, 1, 5),
      Transfer::send(1, x + 6, 1, 2), Transfer::recv(2, x + 7, 1, 0)};
  // Sends to rank 1 sat at 0, 3, 5, 6 with tags 5, 2, 5, 2: now 2, 2, 5, 5 in posting order
  // within each tag (3 before 6, 0 before 5); receives from rank 1 at 1, 4 swap; rank 2's stay.
  EXPECT_EQ(order_by_tag(t), (std::vector<size_t>{3, 4, 2, 6, 1, 0, 5, 7}));
  EXPECT_TRUE(order_by_tag({}).empty());
}

TEST(ExchangeOrder, OrderMatchingThenPairsWhatTagMatchingPairs) {
  // Rank 0 sends tags 2, 1, 2 to rank 1; rank 1 receives them posted as 1, 2, 2. By tag the
  // pairs are (1st tag-2 send, 1st tag-2 recv), (tag 1, tag 1), (2nd tag 2, 2nd tag 2).
  int s[3], r[3];
  const std::vector<Transfer> sends{Transfer::send(1, s + 0, 1, 2), Transfer::send(1, s + 1, 1, 1),
                                    Transfer::send(1, s + 2, 1, 2)};
  const std::vector<Transfer> recvs{Transfer::recv(0, r + 0, 1, 1), Transfer::recv(0, r + 1, 1, 2),
                                    Transfer::recv(0, r + 2, 1, 2)};
  const std::vector<size_t> so = order_by_tag(sends), ro = order_by_tag(recvs);
  ASSERT_EQ(so.size(), ro.size());
  std::vector<std::pair<void*, void*>> pairs;
  for (size_t k = 0; k < so.size(); ++k) pairs.emplace_back(sends[so[k]].buf, recvs[ro[k]].buf);
  EXPECT_EQ(pairs, (std::vector<std::pair<void*, void*>>{{s + 1, r + 0}, {s + 0, r + 1}, {s + 2, r + 2}}));
}

TEST(ExchangeOrder, BadTransfersAreErrorsNamingTheRank) {
  float x = 0.0f;
  EXPECT_NE(error_of([&] { check_exchange({Transfer::send(3, &x, 1)}, 1, 3); })
                .find("rank 1: send to rank 3 in a world of 3"), std::string::npos);
  EXPECT_NE(error_of([&] { check_exchange({Transfer::recv(0, &x, -1)}, 2, 3); })
                .find("rank 2: receive from rank 0 of -1 elements"), std::string::npos);
  EXPECT_NE(error_of([&] { check_exchange({Transfer::recv<float>(0, nullptr, 4)}, 0, 2); })
                .find("has no buffer"), std::string::npos);
  EXPECT_NO_THROW(check_exchange({Transfer::recv<float>(1, nullptr, 0)}, 0, 2));
}

TEST(ThreadedCommFailures, MismatchedCollectiveSizesAreAnErrorOnEveryRank) {
  std::atomic<int> errors{0};
  const std::string msg = error_of([&] {
    run_threaded(4, [&](Communicator& c) {
      std::vector<float> v(c.rank() == 2 ? 5 : 4, 1.0f);
      try {
        c.all_reduce_sum(v.data(), int64_t(v.size()));
      } catch (const Error&) {
        ++errors;
        throw;
      }
    });
  });
  EXPECT_NE(msg.find("disagree"), std::string::npos) << msg;
  EXPECT_NE(msg.find("all_reduce(5 x f32"), std::string::npos) << msg;
  EXPECT_EQ(errors.load(), 4);
}

TEST(ThreadedCommFailures, MismatchedReceiveSizeIsAnError) {
  const std::string msg = error_of([&] {
    run_threaded(2, [](Communicator& c) {
      std::vector<float> buf(8, 0.0f);
      const int peer = 1 - c.rank();
      c.exchange({Transfer::send(peer, buf.data(), c.rank() == 0 ? 8 : 4),
                  Transfer::recv(peer, buf.data(), c.rank() == 0 ? 4 : 4)})->wait();
      c.barrier();
    });
  });
  EXPECT_NE(msg.find("expected 4 x f32 from rank 0"), std::string::npos) << msg;
}

TEST(ThreadedCommFailures, ARankThatThrowsTakesTheOthersDownWithItsMessage) {
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<int> others_failed{0};
  const std::string msg = error_of([&] {
    run_threaded(5, [&](Communicator& c) {
      if (c.rank() == 3) throw Error("bad sample 42");
      try {
        c.barrier();  // rank 3 never comes: the others must not wait for the timeout
        std::vector<float> v(3, 1.0f);
        c.all_reduce_sum(v.data(), 3);
      } catch (const Error& e) {
        if (std::string(e.what()).find("rank 3 failed: bad sample 42") != std::string::npos)
          ++others_failed;
        throw;
      }
    }, 60s);
  });
  EXPECT_NE(msg.find("rank 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad sample 42"), std::string::npos) << msg;
  EXPECT_EQ(others_failed.load(), 4);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

TEST(ThreadedCommFailures, ARankThatNeverArrivesIsNamedAfterTheTimeout) {
  const std::string msg = error_of([&] {
    run_threaded(3, [](Communicator& c) {
      if (c.rank() == 1) {
        std::this_thread::sleep_for(600ms);  // stuck elsewhere, then gone
        return;
      }
      c.barrier();
    }, 200ms);
  });
  EXPECT_NE(msg.find("rank(s) 1 did not reach barrier"), std::string::npos) << msg;
}

TEST(ThreadedCommFailures, AReceiveNobodySendsTimesOut) {
  const std::string msg = error_of([&] {
    run_threaded(2, [](Communicator& c) {
      float x = 0.0f;
      if (c.rank() == 0) c.exchange({Transfer::recv(1, &x, 1, 9)})->wait();
    }, 200ms);
  });
  EXPECT_NE(msg.find("no message from rank 1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dhp

namespace dhp {
namespace {

// The threaded world's collectives are rendezvous: it says it cannot overlap them, and a
// caller that tries anyway gets an error instead of a rank blocked mid-backward.
TEST(ThreadedComm, RefusesToOverlapCollectives) {
  run_threaded(2, [](Communicator& c) {
    EXPECT_FALSE(c.overlapping_collectives());
    float x = 1.0f;
    EXPECT_THROW(c.start_all_reduce(&x, 1, DataType::F32, ReduceOp::Sum), Error);
    EXPECT_THROW(c.start_reduce(&x, 1, DataType::F32, 0), Error);
    EXPECT_THROW(c.start_broadcast(&x, 1, DataType::F32, 0), Error);
  });
}

}  // namespace
}  // namespace dhp
