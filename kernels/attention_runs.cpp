#include "kernels/attention_runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

namespace dhp {

void attention_runs(std::vector<AttnRun>& out, const int32_t* doc, const int32_t* idx,
                    const int32_t* blk, int64_t T) {
  out.clear();
  for (int64_t t = 0; t < T; ++t) {
    if (!out.empty()) {
      AttnRun& r = out.back();
      const bool next = idx[t] == r.idx_lo + int32_t(r.len) && r.consecutive;
      // A text run continues only in order; a block's run takes any idx (it sees all of itself).
      if (doc[t] == r.doc && blk[t] == r.blk && (next || r.blk >= 0)) {
        r.consecutive = next;
        r.idx_lo = std::min(r.idx_lo, idx[t]);
        r.idx_hi = std::max(r.idx_hi, idx[t]);
        ++r.len;
        continue;
      }
    }
    out.push_back(AttnRun{t, 1, doc[t], blk[t], idx[t], idx[t], true});
  }
}

RunPair pair_runs(const AttnRun& q, const AttnRun& k) {
  if (q.doc != k.doc || q.len == 0 || k.len == 0) return RunPair::none;
  if (q.blk >= 0 && q.blk == k.blk) return RunPair::full;
  // Outside a shared block the causal rule decides: key idx <= query idx. The same positions
  // on both sides are a diagonal (a one-token run too, which is also full).
  if (q.consecutive && k.consecutive && q.idx_lo == k.idx_lo && q.len == k.len)
    return RunPair::causal;
  if (k.idx_hi <= q.idx_lo) return RunPair::full;
  if (k.idx_lo > q.idx_hi) return RunPair::none;
  return RunPair::partial;
}

AttnPartition partition_attention(AttnRuns q, AttnRuns k) {
  AttnPartition p;
  auto fail = [&](std::string why) {
    p = AttnPartition{};
    p.why = std::move(why);
    return p;
  };
  std::unordered_map<int32_t, std::vector<const AttnRun*>> keys_of_doc;
  for (const AttnRun& r : k) keys_of_doc[r.doc].push_back(&r);
  std::unordered_map<int64_t, int64_t> key_owner;  // key run start -> query run start
  bool any_causal = false, any_full = false;
  for (const AttnRun& qr : q) {
    auto it = keys_of_doc.find(qr.doc);
    if (it == keys_of_doc.end()) continue;
    const AttnRun* first = nullptr;
    int64_t k_end = 0;
    RunPair kind = RunPair::none;
    for (const AttnRun* kr : it->second) {
      const RunPair pr = pair_runs(qr, *kr);
      if (pr == RunPair::none) continue;
      if (pr == RunPair::partial)
        return fail(fmt::format("query tokens {}..{} see only part of key tokens {}..{}", qr.start,
                                qr.start + qr.len, kr->start, kr->start + kr->len));
      const auto [owner, fresh] = key_owner.emplace(kr->start, qr.start);
      if (!fresh)
        return fail(fmt::format("key tokens {}..{} are seen by query runs at {} and {}",
                                kr->start, kr->start + kr->len, owner->second, qr.start));
      if (!first) {
        first = kr;
        kind = pr;
      } else if (kind != RunPair::full || pr != RunPair::full || kr->start != k_end) {
        return fail(fmt::format("query tokens {}..{} see key runs that are not one full block",
                                qr.start, qr.start + qr.len));
      }
      k_end = kr->start + kr->len;
    }
    if (!first) continue;
    (kind == RunPair::causal ? any_causal : any_full) = true;
    p.segs.push_back(AttnSegment{qr.start, qr.len, first->start, k_end - first->start});
  }
  if (any_causal && any_full) return fail("the call mixes causal diagonals and full blocks");
  // Entries are ragged offsets into the packed tensors: both sides in increasing order.
  for (size_t i = 1; i < p.segs.size(); ++i)
    if (p.segs[i].k_start < p.segs[i - 1].k_start + p.segs[i - 1].k_len)
      return fail(fmt::format("key tokens {}.. come before key tokens {}.. that earlier queries see",
                              p.segs[i].k_start, p.segs[i - 1].k_start));
  p.ok = true;
  p.causal = any_causal;
  for (const AttnSegment& s : p.segs) {
    p.q_covered += s.q_len;
    p.k_covered += s.k_len;
    p.max_q = std::max(p.max_q, s.q_len);
    p.max_k = std::max(p.max_k, s.k_len);
  }
  return p;
}

}  // namespace dhp
