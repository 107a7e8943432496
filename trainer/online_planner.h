// The planner a training run plans with, refitted online (parallel.refit): every step's
// measured group times join a window of observations, the cost model's coefficients are
// refitted to them and the next plans use the result. The window and the coefficients are
// part of a checkpoint, so a resumed run goes on planning from where it stopped.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/planner.h"
#include "trainer/config.h"
#include "trainer/executor.h"

namespace dhp {

// How the plan's prediction compared with the step as it ran.
struct CostCheck {
  double error = 0.0;       // mean |predicted - measured| / measured over the step's groups
  double measured_s = 0.0;  // the plan's schedule replayed with the measured group times
  std::vector<double> group_seconds;  // every group's measured time (its slowest member's)
};

// What this run's engine holds, for its planner's memory model: the storage dtype of
// train.precision and the parameter table's aligned totals.
EngineLayout engine_layout(const Config& cfg);

class OnlinePlanner {
 public:
  OnlinePlanner(const Config& cfg, Communicator& comm);

  // The planner of the current cost model. A refit replaces it (never modifies it), so a plan
  // being made on another thread keeps the one it started with. Thread-safe.
  std::shared_ptr<const Planner> current() const;

  // Adds the measured group times of `work` (this rank's `timings`; every rank calls it, the
  // slowest member's time counts) and refits. Every rank sees the same numbers, so every rank
  // refits to the same coefficients and keeps planning identically.
  CostCheck learn(const StepWork& work, const std::vector<GroupTiming>& timings);

  // The state a checkpoint keeps (CostState JSON), "" when the run does not refit.
  std::string saved() const;
  // A resumed run plans with the coefficients and observations its checkpoint carries, when
  // they refine the same cost profile.
  void restore(const std::string& saved);

 private:
  void replace(const CostModel& cost);

  const ParallelConfig& cfg_;
  const ParamGroups groups_;  // which parameters train: the memory model counts their state
  const EngineLayout engine_;
  Communicator& comm_;
  const bool rank0_;
  mutable std::mutex mu_;
  std::shared_ptr<const Planner> planner_;
  std::deque<TimingObservation> observed_;  // the latest groups' measured times
  int64_t steps_seen_ = 0;                  // steps learnt from since this process started
};

}  // namespace dhp
