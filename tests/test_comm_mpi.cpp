// The MPI communicator against the same serial computations as the threaded one; ctest runs
// it under mpirun with 3 ranks (and it also runs as a singleton world of one).
#include <gtest/gtest.h>

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
