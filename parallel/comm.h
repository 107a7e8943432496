// The run's one global communicator. Groups formed by the planner are logical rank lists
// inside it, so re-forming them every step creates no communicator (design.md §3).
// Without MPI, or started without a launcher, the world is a single rank.
#pragma once

#include <cstdint>

namespace dhp {

class Comm {
 public:
  // Initialises MPI when built with it (a process started without mpirun is a singleton);
  // MPI is finalised when the process exits.
  Comm(int* argc, char*** argv);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // In-place sum over all ranks. The reduction order is fixed by MPI's algorithm for a given
  // world size, so results are reproducible run to run.
  void allreduce_sum(float* data, int64_t n) const;
  void allreduce_sum(double* data, int64_t n) const;
  void barrier() const;

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace dhp
