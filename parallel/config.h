// [parallel] section: how a global batch is spread over the ranks every step.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/strategy.h"
#include "types/recompute.h"

namespace dhp {

inline constexpr int kMaxZero = 3;  // the highest ZeRO stage (parallel.zero)

struct ParallelConfig {
  Strategy strategy = Strategy::dhp;  // one of the trainable strategies (parallel/strategy.h)
  double memory_gb = 80.0;         // usable memory per device for the memory model
  // ZeRO stage over all ranks: 0 replicates everything; 1 shards the optimizer state (and, in
  // bf16, the fp32 master weights); 2 also the gradients (trainer/grad_reducer.h); 3 also the
  // decoder layers' weights (trainer/layer_gather.h). Read from the flag parallel.zero1 of
  // earlier configurations as 0 and 1.
  int zero = 1;
  bool shards_optimizer() const { return zero >= 1; }
  // ZeRO-2 in force: on one rank there is nothing to shard the gradients over.
  bool shards_gradients(int world) const { return zero >= 2 && world > 1; }
  // ZeRO-3 in force.
  bool shards_weights(int world) const { return zero >= 3 && world > 1; }
  int ranks_per_node = 0;          // ranks on one node; placement keeps groups inside a node when
                                   // it can. 0 = auto: a run takes the launcher's placement
                                   // (parallel/placement.h); a Planner given 0 has one node
  int static_cp = 0;               // static strategy's CP degree; 0 = smallest that fits
  double planner_budget_ms = 5.0;  // time the planner may spend improving a plan
  // Cost-model profile: "cpu" (measured) or a GPU name (parallel/cost_model.h); "auto" is the
  // device's own, chosen when the run knows its device (resolve_device_defaults).
  std::string cost_profile = "auto";
  Recompute recompute = Recompute::off;  // activations rebuilt in backward (types/recompute.h):
                                         // the engine runs it and the planner prices it
  bool refit = true;               // refit the cost model from measured group times each step
  int refit_window = 64;           // the most recent groups the refit uses
  bool overlap_grads = true;       // sum gradient buckets over ranks while backward goes on
                                   // (where the communicator overlaps collectives: MPI, NCCL)
  double bucket_mb = 25.0;         // size of those buckets
  double timeout_s = 60.0;         // longest wait for other ranks before the run stops with
                                   // an error naming the rank (a dead or stopped peer)
};

}  // namespace dhp
