// Compute threads that follow the cores other processes leave free.
//
// OpenMP threads meet at a barrier after every parallel loop. When another busy process holds
// one of the cores, a team with more threads than free cores waits at every barrier for a
// thread that is not running, and a step slows down many times over instead of by the share
// of the machine that was lost. Between steps, the CPU busy time of this process's cores
// (/proc/stat, per core of the affinity mask) minus this process's own CPU time says how many
// cores the others use; the team shrinks to the cores left and grows back when they are free.
// Results do not depend on the thread count (every kernel fixes its order of accumulation), so
// this changes speed only.
#pragma once

#include <chrono>
#include <vector>

namespace dhp::cpu {

// The policy, on its own so that it can be tested: the free cores rounded to the nearest
// whole core, at least 1 and at most `configured`.
int threads_for_free_cores(int configured, double cores, double others_busy);

class LoadMonitor {
 public:
  LoadMonitor();
  // The thread count for the next step. Samples the load at most every kMinInterval so the
  // 10 ms resolution of /proc/stat does not make it jitter; holds `configured` where the
  // load cannot be read.
  int threads_for(int configured);
  double others_busy() const { return others_; }  // cores, smoothed

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr double kMinInterval = 0.5;  // seconds
  bool sample(double* busy_s, double* own_s) const;
  std::vector<int> cores_;                 // CPUs this process may run on
  Clock::time_point last_;
  double last_busy_ = 0.0, last_own_ = 0.0;
  double others_ = 0.0;
  bool ok_ = false;
  int current_ = 0;
};

}  // namespace dhp::cpu
