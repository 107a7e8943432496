#include "parallel/placement.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

#include "core/check.h"
#include "core/hash.h"

namespace dhp {
namespace {

// This host, as NCCL tells hosts apart: the hostname, and the boot id that differs between
// machines (or containers on different machines) that were given the same name.
int64_t host_key() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  std::string id = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string line;
  if (std::getline(boot, line)) id += "|" + line;
  return int64_t(fnv1a(id.data(), id.size(), kFnvSeed) & 0x7fffffffffffffffull);
}

// "0-3", "0,2,4": a node's ranks for a message.
std::string rank_list(const std::vector<int>& ranks) {
  const bool run = ranks.back() - ranks.front() + 1 == int(ranks.size());
  if (run && ranks.size() > 2) return fmt::format("{}-{}", ranks.front(), ranks.back());
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    if (i) s += ',';
    s += std::to_string(ranks[i]);
  }
  return ranks.size() > 8 ? s + ",..." : s;
}

}  // namespace

Placement detect_placement(Communicator& comm) {
  Placement p;
  int64_t key = 0;
  if (const char* k = std::getenv("DHP_NODE_SIZE"); k && *k) {
    char* end = nullptr;
    const long size = std::strtol(k, &end, 10);
    DHP_CHECK(*end == '\0' && size >= 1 && size <= (1 << 20),
              "DHP_NODE_SIZE='{}': must be a number of ranks per node, at least 1", k);
    key = comm.rank() / size;
    p.source = fmt::format("DHP_NODE_SIZE={} (every {} consecutive ranks act as one node)", k, size);
  } else {
    key = host_key();
    p.source = "the hosts the launcher put the ranks on";
  }
  std::vector<int64_t> keys(size_t(comm.size()), 0);
  comm.all_gather(&key, keys.data(), 1, DataType::I64);
  std::map<int64_t, int> index;
  for (int64_t k : keys) {
    index.emplace(k, int(index.size()));
    p.node_of_rank.push_back(index[k]);
  }
  return p;
}

int Placement::nodes() const {
  int n = 0;
  for (int v : node_of_rank) n = std::max(n, v + 1);
  return n;
}

int Placement::ranks_per_node() const {
  const int world = int(node_of_rank.size()), n = nodes();
  if (n == 0 || world % n != 0) return 0;
  const int m = world / n;
  for (int r = 0; r < world; ++r)
    if (node_of_rank[size_t(r)] != r / m) return 0;
  return m;
}

int resolve_ranks_per_node(int stated, const Placement& p) {
  const int world = int(p.node_of_rank.size()), nodes = p.nodes(), m = p.ranks_per_node();
  if (m == 0) {
    std::vector<std::vector<int>> members(static_cast<size_t>(nodes));
    for (int r = 0; r < world; ++r) members[size_t(p.node_of_rank[size_t(r)])].push_back(r);
    std::string where;
    for (int n = 0; n < nodes && n < 6; ++n)
      where += fmt::format("{}node {}: ranks {}", n ? "; " : "", n, rank_list(members[size_t(n)]));
    if (nodes > 6) where += "; ...";
    throw Error(fmt::format(
        "the {} ranks are not placed as the planner needs (each node holding the same number of "
        "consecutive ranks): {} ({}). Launch with `mpirun --map-by ppr:N:node` (N ranks on every node, "
        "filled in order) or `srun --distribution=block` with the same number of tasks on every node",
        world, where, p.source));
  }
  DHP_CHECK(stated == 0 || stated == m,
            "parallel.ranks_per_node = {}, but the launcher placed {} ranks on each of {} node(s) ({}); "
            "leave it at 0 (auto) or set {}",
            stated, m, nodes, p.source, m);
  return m;
}

}  // namespace dhp
