// ZeRO's partition of the gradient layout (the trainable parameters, ParamSpec::grad_offset)
// over the ranks: rank r holds block [r·s, (r+1)·s) of the n elements, s = floor(n / N), and
// every rank holds the tail [N·s, n) of fewer than N elements. The optimizer keeps its moments
// for what a rank holds, and, where the working weights are narrower than fp32, the model keeps
// the fp32 master weights for it alone (the distributed optimizer).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace dhp {

// Which part a rank holds: all of it (world = 1), or block `rank` of `world`.
struct OptimizerShard {
  int rank = 0;
  int world = 1;
};

struct CompactShard {
  OptimizerShard shard;
  int64_t n = 0;  // elements of the gradient layout

  int64_t block() const { return n / shard.world; }
  int64_t lo() const { return int64_t(shard.rank) * block(); }
  int64_t tail_begin() const { return int64_t(shard.world) * block(); }
  int64_t tail() const { return n - tail_begin(); }
  // Elements held: the block and the tail (all n when world = 1).
  int64_t held_size() const { return block() + tail(); }
  // The two ranges held, each with its offset among the held elements.
  struct Range {
    int64_t begin, end, local;
  };
  std::array<Range, 2> held() const {
    return {Range{lo(), lo() + block(), 0}, Range{tail_begin(), n, block()}};
  }
  // Calls f(rank, a, b) for each rank's block overlap [a, b) with [begin, end), in rank order;
  // the tail, which every rank holds, is left out.
  template <class F>
  void for_each_block(int64_t begin, int64_t end, F&& f) const {
    const int64_t stop = std::min(end, tail_begin());
    for (int64_t a = std::max<int64_t>(begin, 0); block() > 0 && a < stop;) {
      const int r = int(a / block());
      const int64_t b = std::min(stop, int64_t(r + 1) * block());
      f(r, a, b);
      a = b;
    }
  }
  // Calls f(range, a, b) for each held range's overlap [a, b) with [begin, end).
  template <class F>
  void for_each_held(int64_t begin, int64_t end, F&& f) const {
    for (const Range& h : held()) {
      const int64_t a = std::max(begin, h.begin), b = std::min(end, h.end);
      if (a < b) f(h, a, b);
    }
  }
};

}  // namespace dhp
