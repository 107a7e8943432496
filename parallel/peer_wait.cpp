#include "parallel/peer_wait.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "core/clock.h"

namespace dhp {
namespace {

constexpr double kEagerSeconds = 0.005;
constexpr std::chrono::microseconds kSleepStep{10}, kMaxSleep{100};

}  // namespace

void WaitTime::wait(PendingExchange& ex) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = thread_cpu_seconds();
  ex.wait();
  cpu += thread_cpu_seconds() - c0;
  wall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double PeerPoll::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void PeerPoll::pause() {
  if (seconds() < kEagerSeconds) {
    sched_yield();
    return;
  }
  sleep_ = std::min(kMaxSleep, sleep_ + kSleepStep);
  std::this_thread::sleep_for(sleep_);
}

}  // namespace dhp
