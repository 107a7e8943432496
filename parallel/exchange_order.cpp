#include "parallel/exchange_order.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace dhp {

std::vector<size_t> order_by_tag(const std::vector<Transfer>& transfers) {
  // Each transfer moves to the next slot its (peer, kind) group held in the caller's order,
  // taking that group's transfers by ascending tag: the interleaving of groups is kept, so a
  // caller that posts receives before sends still does.
  std::vector<size_t> sorted(transfers.size());
  std::iota(sorted.begin(), sorted.end(), size_t(0));
  auto group_less = [&](size_t a, size_t b) {
    const Transfer &x = transfers[a], &y = transfers[b];
    if (x.peer != y.peer) return x.peer < y.peer;
    if (x.kind != y.kind) return x.kind < y.kind;
    return x.tag < y.tag;
  };
  std::stable_sort(sorted.begin(), sorted.end(), group_less);
  std::vector<size_t> slots(transfers.size());
  std::iota(slots.begin(), slots.end(), size_t(0));
  auto same_group = [&](size_t a, size_t b) {
    return transfers[a].peer == transfers[b].peer && transfers[a].kind == transfers[b].kind;
  };
  std::stable_sort(slots.begin(), slots.end(), [&](size_t a, size_t b) {
    const Transfer &x = transfers[a], &y = transfers[b];
    if (x.peer != y.peer) return x.peer < y.peer;
    return x.kind < y.kind;
  });
  // `slots` lists each group's positions in the caller's order, `sorted` its transfers by tag;
  // both walk the groups in the same order, so position k of one takes element k of the other.
  std::vector<size_t> order(transfers.size());
  for (size_t k = 0; k < transfers.size(); ++k) {
    DHP_ASSERT(same_group(slots[k], sorted[k]));
    order[slots[k]] = sorted[k];
  }
  return order;
}

void check_exchange(const std::vector<Transfer>& transfers, int rank, int world) {
  for (const Transfer& t : transfers) {
    const char* what = t.kind == Transfer::Send ? "send to" : "receive from";
    DHP_CHECK(t.peer >= 0 && t.peer < world, "rank {}: {} rank {} in a world of {}", rank, what,
              t.peer, world);
    DHP_CHECK(t.count >= 0, "rank {}: {} rank {} of {} elements", rank, what, t.peer, t.count);
    DHP_CHECK(t.count == 0 || t.buf != nullptr, "rank {}: {} rank {} of {} x {} has no buffer",
              rank, what, t.peer, t.count, data_type_name(t.type));
  }
}

}  // namespace dhp
