// Where the ranks of a job run: which ranks share a node. The planner keeps rings inside a
// node when it can and prices the ones that span nodes at inter-node bandwidth, so its idea of
// a node must be the launcher's placement, not a number typed into a config.
#pragma once

#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace dhp {

struct Placement {
  std::vector<int> node_of_rank;  // node index of every rank, numbered by first rank
  std::string source;             // how the nodes were found, for the log

  int nodes() const;
  // m when node n holds ranks n*m .. n*m+m-1 for every n, else 0.
  int ranks_per_node() const;
};

// Collective: every rank of `comm` calls it. A node is a host as NCCL identifies one (its
// hostname and boot id). DHP_NODE_SIZE=k in the environment makes every k consecutive ranks a
// node instead, so that one machine can act as several (tests, trying a placement rule).
Placement detect_placement(Communicator& comm);

// parallel.ranks_per_node as the run will use it: `stated` (0 = auto) checked against the
// placement. Refused, naming both: a stated value that disagrees; nodes that hold different
// numbers of ranks or ranks that are not consecutive (a round-robin mapping), which the
// planner's node rule (rank / ranks_per_node) cannot describe.
int resolve_ranks_per_node(int stated, const Placement& placement);

}  // namespace dhp
