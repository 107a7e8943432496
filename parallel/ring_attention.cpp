#include "parallel/ring_attention.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "core/check.h"
#include "kernels/attention_runs.h"

namespace dhp {
namespace {

// Tags of the pass set-up, above every per-layer tag.
constexpr int kPrepareTag = 30000;
// Per-layer tags: four streams (K, V, dK, dV) per layer, wrapped well below kPrepareTag (the
// MPI standard guarantees tags up to 32767). Messages between two ranks under one tag arrive
// in order, so wrapping only needs distinct tags among layers in flight at once.
constexpr int kLayerTags = 7000;
enum Stream { kK = 0, kV = 1, kDK = 2, kDV = 3 };

}  // namespace

RingAttention::RingAttention(Communicator& comm, Backend& backend, std::vector<int> group)
    : comm_(comm),
      backend_(backend),
      ops_(backend.ops()),
      meta_arena_(backend),
      work_(backend) {
  regroup(std::move(group));
}

void RingAttention::regroup(std::vector<int> group) {
  group_ = std::move(group);
  d_ = int(group_.size());
  const auto it = std::find(group_.begin(), group_.end(), comm_.rank());
  DHP_ASSERT(d_ >= 1 && it != group_.end());
  DHP_ASSERT(std::set<int>(group_.begin(), group_.end()).size() == group_.size());
  me_ = int(it - group_.begin());
  next_ = group_[size_t((me_ + 1) % d_)];
  prev_ = group_[size_t((me_ + d_ - 1) % d_)];
}

int RingAttention::tag(int layer, int what) const { return (layer % kLayerTags) * 4 + what; }

std::unique_ptr<PendingExchange> RingAttention::pass_pair(CAct a, CAct b, int64_t n_send,
                                                          Act into_a, Act into_b, int64_t n_recv,
                                                          int tag_a, int tag_b) {
  return comm_.exchange({Transfer::send(next_, a, n_send, tag_a),
                         Transfer::send(next_, b, n_send, tag_b),
                         Transfer::recv(prev_, into_a, n_recv, tag_a),
                         Transfer::recv(prev_, into_b, n_recv, tag_b)});
}

AttnMeta RingAttention::member_meta(int j) const {
  const auto& r = runs_[size_t(j)];
  const AttnRuns runs{r.data(), int64_t(r.size())};
  if (j == me_) return AttnMeta{meta_.doc, meta_.idx, meta_.blk, runs};
  return AttnMeta{doc_[size_t(j)], idx_[size_t(j)], blk_[size_t(j)], runs};
}

void RingAttention::prepare(AttnMeta meta, int64_t T) {
  waited_ = {};
  meta_ = meta;
  T_.assign(size_t(d_), 0);
  T_[size_t(me_)] = T;
  if (d_ > 1) {
    std::vector<Transfer> t;
    for (int j = 0; j < d_; ++j)
      if (j != me_) {
        t.push_back(Transfer::send(group_[size_t(j)], &T, 1, kPrepareTag));
        t.push_back(Transfer::recv(group_[size_t(j)], &T_[size_t(j)], 1, kPrepareTag));
      }
    waited_.wait(*comm_.exchange(t));
  }
  doc_.assign(size_t(d_), nullptr);
  idx_.assign(size_t(d_), nullptr);
  blk_.assign(size_t(d_), nullptr);
  meta_arena_.carve([&](Carver& c) {
    for (int j = 0; j < d_; ++j) {
      if (j == me_) continue;
      doc_[size_t(j)] = c.take<int32_t>(T_[size_t(j)]);  // (T_j)
      idx_[size_t(j)] = c.take<int32_t>(T_[size_t(j)]);  // (T_j)
      blk_[size_t(j)] = c.take<int32_t>(T_[size_t(j)]);  // (T_j)
    }
  });
  if (d_ > 1) {
    std::vector<Transfer> t;
    for (int j = 0; j < d_; ++j) {
      if (j == me_) continue;
      const int peer = group_[size_t(j)];
      t.push_back(Transfer::send(peer, meta.doc, T, kPrepareTag + 1));
      t.push_back(Transfer::send(peer, meta.idx, T, kPrepareTag + 2));
      t.push_back(Transfer::send(peer, meta.blk, T, kPrepareTag + 3));
      t.push_back(Transfer::recv(peer, doc_[size_t(j)], T_[size_t(j)], kPrepareTag + 1));
      t.push_back(Transfer::recv(peer, idx_[size_t(j)], T_[size_t(j)], kPrepareTag + 2));
      t.push_back(Transfer::recv(peer, blk_[size_t(j)], T_[size_t(j)], kPrepareTag + 3));
    }
    waited_.wait(*comm_.exchange(t));
  }

  // Which members hold a key that one of my queries may see: per document, the latest query
  // position and the image blocks my queries are in. Read once per pass, on the host.
  auto host = [&](const int32_t* p, int64_t n) {
    std::vector<int32_t> h(static_cast<size_t>(n));
    if (n) backend_.download(h.data(), p, sizeof(int32_t) * size_t(n));
    return h;
  };
  const auto qdoc = host(meta.doc, T), qidx = host(meta.idx, T), qblk = host(meta.blk, T);
  std::map<int32_t, int32_t> latest;  // doc -> latest query position
  std::set<std::pair<int32_t, int32_t>> blocks;  // (doc, blk) of my queries in a block
  for (int64_t t = 0; t < T; ++t) {
    auto [it, fresh] = latest.emplace(qdoc[t], qidx[t]);
    if (!fresh) it->second = std::max(it->second, qidx[t]);
    if (qblk[t] >= 0) blocks.emplace(qdoc[t], qblk[t]);
  }
  visible_.assign(size_t(d_), 0);
  // Every member's runs too, for backends that run attention on per-sequence lengths.
  runs_.resize(size_t(d_));
  for (int j = 0; j < d_; ++j) {
    const AttnMeta m = j == me_ ? meta_ : AttnMeta{doc_[size_t(j)], idx_[size_t(j)], blk_[size_t(j)]};
    const auto kdoc = host(m.doc, T_[size_t(j)]), kidx = host(m.idx, T_[size_t(j)]),
               kblk = host(m.blk, T_[size_t(j)]);
    attention_runs(runs_[size_t(j)], kdoc.data(), kidx.data(), kblk.data(), T_[size_t(j)]);
    for (size_t t = 0; t < kdoc.size() && !visible_[size_t(j)]; ++t) {
      const auto it = latest.find(kdoc[t]);
      if (it == latest.end()) continue;
      visible_[size_t(j)] = kidx[t] <= it->second || (kblk[t] >= 0 && blocks.count({kdoc[t], kblk[t]}));
    }
  }
}

void RingAttention::forward(int layer, Act out, float* lse, CAct q, CAct k, CAct v,
                            const AttnDims& d) {
  const int64_t T = T_[size_t(me_)], kvd = int64_t(d.Hkv) * d.hd, qd = int64_t(d.Hq) * d.hd;
  const int64_t maxT = *std::max_element(T_.begin(), T_.end());
  const AttnMeta mine = member_meta(me_);
  blocks_computed_ = 0;
  if (d_ == 1) {
    ops_.attention_forward(out, lse, q, k, v, mine, mine, attn_shape(d, T, T));
    blocks_computed_ = 1;
    return;
  }
  // The output is merged block by block in fp32 whatever the storage, and rounded to it once
  // after the last merge (as dQ and dK/dV in backward).
  const DType t = ops_.dtype();
  Act kbuf[2], vbuf[2], part_out;
  float *part_lse, *out_acc;
  work_.carve([&](Carver& c) {
    for (int b = 0; b < 2; ++b) {
      kbuf[b] = c.take(maxT * kvd, t);  // (maxT, Hkv·hd) blocks arriving from prev
      vbuf[b] = c.take(maxT * kvd, t);
    }
    part_out = c.take(T * qd, t);                 // (T, Hq·hd) one block's result
    part_lse = c.take<float>(int64_t(d.Hq) * T);  // (Hq, T)
    out_acc = c.take<float>(T * qd);              // (T, Hq·hd) the running result
  });

  CAct cur_k = k;
  CAct cur_v = v;
  for (int s = 0; s < d_; ++s) {
    const int from = source(s);
    const int64_t Tf = T_[size_t(from)];
    // The next block travels while this one computes.
    std::unique_ptr<PendingExchange> next_block;
    if (s + 1 < d_) {
      const int64_t n_recv = T_[size_t(source(s + 1))] * kvd;
      next_block = pass_pair(cur_k, cur_v, Tf * kvd, kbuf[(s + 1) % 2], vbuf[(s + 1) % 2], n_recv,
                             tag(layer, kK), tag(layer, kV));
    }
    if (s == 0) {
      // The local block always runs: it writes the base of every later merge and its lse.
      ops_.attention_forward(part_out, lse, q, k, v, mine, mine, attn_shape(d, T, T));
      ops_.fill(out_acc, 0.0f, T * qd);
      ops_.accumulate(out_acc, part_out, T * qd);
      ++blocks_computed_;
    } else if (visible_[size_t(from)] && T > 0 && Tf > 0) {
      ops_.attention_forward(part_out, part_lse, q, cur_k, cur_v, mine, member_meta(from),
                             attn_shape(d, T, Tf));
      ops_.attention_merge(out_acc, lse, part_out, part_lse, T, d.Hq, d.hd);
      ++blocks_computed_;
    }
    if (next_block) {
      waited_.wait(*next_block);
      cur_k = kbuf[(s + 1) % 2];
      cur_v = vbuf[(s + 1) % 2];
    }
  }
  ops_.cast(out, out_acc, T * qd);
}

void RingAttention::backward(int layer, Act dq, Act dk, Act dv, CAct dout, CAct out,
                             const float* lse, CAct q, CAct k, CAct v, const AttnDims& d) {
  const int64_t T = T_[size_t(me_)], kvd = int64_t(d.Hkv) * d.hd, qd = int64_t(d.Hq) * d.hd;
  const AttnMeta mine = member_meta(me_);
  if (d_ == 1) {
    ops_.attention_backward(dq, dk, dv, dout, out, lse, q, k, v, mine, mine,
                            attn_shape(d, T, T));
    return;
  }
  const int64_t maxT = *std::max_element(T_.begin(), T_.end());
  // The sums over ring steps — dQ over the key blocks, each block's dK/dV over the ranks it
  // visits — are kept and passed in fp32 whatever the storage, and rounded to it once at the
  // end: in bf16 storage the result then depends on the ring's degree no more than fp32's.
  const DType t = ops_.dtype();
  Act kbuf[2], vbuf[2], dq_part, dk_part, dv_part;
  float *dk_acc[2], *dv_acc[2], *dq_acc;
  work_.carve([&](Carver& c) {
    for (int b = 0; b < 2; ++b) {
      kbuf[b] = c.take(maxT * kvd, t);          // (maxT, Hkv·hd) K/V blocks from prev
      vbuf[b] = c.take(maxT * kvd, t);
      dk_acc[b] = c.take<float>(maxT * kvd);  // (maxT, Hkv·hd) dK/dV accumulators from prev
      dv_acc[b] = c.take<float>(maxT * kvd);
    }
    dq_acc = c.take<float>(T * qd);  // (T, Hq·hd)
    dq_part = c.take(T * qd, t);     // (T, Hq·hd) one block's parts
    dk_part = c.take(maxT * kvd, t);  // (maxT, Hkv·hd)
    dv_part = c.take(maxT * kvd, t);
  });

  CAct cur_k = k;
  CAct cur_v = v;
  std::unique_ptr<PendingExchange> kv_next, acc_next;
  ops_.fill(dq_acc, 0.0f, T * qd);
  for (int s = 0; s < d_; ++s) {
    const int from = source(s);
    const int64_t Tf = T_[size_t(from)];
    // The next K/V block travels while this one computes.
    if (s + 1 < d_) {
      const int64_t n_recv = T_[size_t(source(s + 1))] * kvd;
      kv_next = pass_pair(cur_k, cur_v, Tf * kvd, kbuf[(s + 1) % 2], vbuf[(s + 1) % 2], n_recv,
                          tag(layer, kK), tag(layer, kV));
    }
    // This rank's queries' part of dQ, and of the block's dK/dV.
    const bool compute = visible_[size_t(from)] && T > 0 && Tf > 0;
    float* acc_k = dk_acc[s % 2];
    float* acc_v = dv_acc[s % 2];
    if (compute) {
      ops_.attention_backward(dq_part, dk_part, dv_part, dout, out, lse, q, cur_k, cur_v, mine,
                              member_meta(from), attn_shape(d, T, Tf));
      ops_.accumulate(dq_acc, dq_part, T * qd);
    }
    if (s == 0) {
      ops_.fill(acc_k, 0.0f, Tf * kvd);
      ops_.fill(acc_v, 0.0f, Tf * kvd);
    } else {
      waited_.wait(*acc_next);  // the block's accumulator, with every earlier rank's part
    }
    if (compute) {
      ops_.accumulate(acc_k, dk_part, Tf * kvd);
      ops_.accumulate(acc_v, dv_part, Tf * kvd);
    }
    // Pass the accumulator on; after the last step, the one arriving is this rank's own.
    const int64_t n_recv = T_[size_t(source(s + 1))] * kvd;
    acc_next = pass_pair(acc_k, acc_v, Tf * kvd, dk_acc[(s + 1) % 2], dv_acc[(s + 1) % 2], n_recv,
                         tag(layer, kDK), tag(layer, kDV));
    if (kv_next) {
      waited_.wait(*kv_next);
      kv_next.reset();
      cur_k = kbuf[(s + 1) % 2];
      cur_v = vbuf[(s + 1) % 2];
    }
  }
  waited_.wait(*acc_next);
  ops_.cast(dk, dk_acc[d_ % 2], T * kvd);
  ops_.cast(dv, dv_acc[d_ % 2], T * kvd);
  ops_.cast(dq, dq_acc, T * qd);
}

}  // namespace dhp
