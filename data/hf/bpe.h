// The BPE model of tokenizer.json (models/bpe/{model,word}.rs of Hugging Face `tokenizers`):
// the vocabulary as a token table, the merges as a pair map, the merge queues that apply them
// in the library's order, and the per-caller word cache.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/hf/json_fields.h"

namespace dhp::hf {

// A symbol of a word being merged: the word is a linked list of symbols (prev/next indices).
struct Symbol {
  int32_t id;
  int32_t prev, next;
  uint32_t len;  // bytes; 0 once merged into its left neighbour
};
// The BPE merge queue: a 4-ary min-heap (as the library's dary_heap) of (rank << 32 | position),
// so the lowest rank pops first and, among equal ranks, the leftmost (word.rs's Merge order).
class MergeQueue {
 public:
  static uint64_t key(uint32_t rank, uint32_t pos) { return (uint64_t(rank) << 32) | pos; }
  void clear() { v_.clear(); }
  bool empty() const { return v_.empty(); }
  void add_unordered(uint64_t k) { v_.push_back(k); }
  void make() {
    if (v_.size() > 1)
      for (size_t i = (v_.size() - 2) / 4 + 1; i-- > 0;) sift_down(i, v_[i]);
  }
  bool push(uint64_t k) {
    size_t i = v_.size();
    v_.push_back(k);
    while (i > 0) {
      const size_t parent = (i - 1) / 4;
      if (v_[parent] <= k) break;
      v_[i] = v_[parent];
      i = parent;
    }
    v_[i] = k;
    return true;
  }
  uint64_t pop() {
    const uint64_t top = v_[0];
    const uint64_t last = v_.back();
    v_.pop_back();
    if (!v_.empty()) sift_down(0, last);
    return top;
  }

 private:
  void sift_down(size_t i, uint64_t k) {
    const size_t n = v_.size();
    for (;;) {
      const size_t first = 4 * i + 1;
      if (first >= n) break;
      size_t best = first;
      for (size_t c = first + 1; c < first + 4 && c < n; ++c)
        if (v_[c] < v_[best]) best = c;
      if (v_[best] >= k) break;
      v_[i] = v_[best];
      i = best;
    }
    v_[i] = k;
  }
  std::vector<uint64_t> v_;
};
// The same queue as a radix heap, for long words: pushes append to one of 65 buckets and pops
// come out in (rank, position) order, so the symbols are visited nearly in sequence instead
// of at random. Exact only while no key below the last popped one is pushed, which holds when
// every merge comes after the merges that make its two tokens (training order); push returns
// false otherwise and the word is merged again with MergeQueue.
class RadixQueue {
 public:
  void clear() {
    for (auto& b : buckets_) b.clear();
    last_ = 0;
    size_ = 0;
  }
  bool empty() const { return size_ == 0; }
  void add_unordered(uint64_t k) { push(k); }
  void make() {}
  bool push(uint64_t k) {
    if (k < last_) return false;
    buckets_[bucket(k)].push_back(k);
    ++size_;
    return true;
  }
  uint64_t pop() {
    if (buckets_[0].empty()) {
      size_t i = 1;
      while (buckets_[i].empty()) ++i;
      std::vector<uint64_t>& b = buckets_[i];
      last_ = *std::min_element(b.begin(), b.end());
      for (uint64_t k : b) buckets_[bucket(k)].push_back(k);  // each into a lower bucket
      b.clear();
    }
    const uint64_t k = buckets_[0].back();
    buckets_[0].pop_back();
    --size_;
    return k;
  }

 private:
  size_t bucket(uint64_t k) const { return k == last_ ? 0 : size_t(64 - __builtin_clzll(k ^ last_)); }
  std::array<std::vector<uint64_t>, 65> buckets_;
  uint64_t last_ = 0;
  size_t size_ = 0;
};


// Words already seen -> their ids: the library caches words under 256 bytes too. One per
// Scratch, so no lock; 16-byte slots in a table that fits a core's L2 cache; at most
// kMaxEntries words (or kMaxKeyBytes of them), then it starts afresh (about 2 MB at most).
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kSlots = size_t(1) << 15;  // open addressing, a power of two
  static constexpr size_t kMaxEntries = kSlots / 2;
  static constexpr size_t kMaxKeyBytes = size_t(1) << 20;

  static uint64_t hash(std::string_view w) { return std::hash<std::string_view>{}(w); }
  bool get(std::string_view w, uint64_t h, std::vector<int32_t>& out) const {
    if (slots_.empty()) return false;
    const auto tag = uint32_t(h >> 32);
    for (size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.n_ids == 0) return false;
      if (s.tag == tag && s.key_len == w.size() && std::memcmp(keys_.data() + s.key, w.data(), w.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids, ids_.begin() + s.ids + s.n_ids);
        return true;
      }
    }
  }
  void put(std::string_view w, uint64_t h, const int32_t* ids, size_t n) {
    if (n == 0 || n > UINT16_MAX) return;
    if (slots_.empty() || entries_ >= kMaxEntries || keys_.size() > kMaxKeyBytes) {
      slots_.assign(kSlots, Slot{});
      keys_.clear();
      ids_.clear();
      entries_ = 0;
    }
    size_t i = h & (kSlots - 1);
    while (slots_[i].n_ids != 0) i = (i + 1) & (kSlots - 1);
    slots_[i] = {uint32_t(h >> 32), uint32_t(keys_.size()), uint32_t(ids_.size()), uint16_t(w.size()), uint16_t(n)};
    keys_.append(w);
    ids_.insert(ids_.end(), ids, ids + n);
    ++entries_;
  }

 private:
  struct Slot {
    uint32_t tag = 0;  // the hash's high half (the low bits pick the slot)
    uint32_t key = 0, ids = 0;
    uint16_t key_len = 0, n_ids = 0;  // n_ids 0: empty
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

// A caller's BPE state (one per Scratch): the word's symbols, both queues, its ids and the
// word cache.
struct BpeScratch {
  std::vector<Symbol> symbols;
  MergeQueue queue;
  RadixQueue radix;
  std::vector<int32_t> word_ids;
  WordCache cache;
};

// Open-addressing map (id, id) -> (rank, merged id); key and value side by side, so that a
// lookup costs one cache miss.
class PairMap {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n + n / 2) cap *= 2;  // load factor 1/3 to 2/3
    bits_ = 0;
    while ((size_t(1) << bits_) < cap) ++bits_;
    slots_.assign(cap, Slot{kEmpty, 0, 0});
  }
  // A later duplicate overwrites an earlier one, as the library's HashMap collect does.
  void insert_or_assign(int32_t a, int32_t b, uint32_t rank, int32_t id) {
    const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t i = slot(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & (slots_.size() - 1);
    slots_[i] = {key, rank, id};
  }
  // (rank, merged id), or false.
  bool find(int32_t a, int32_t b, uint32_t* rank, int32_t* id) const {
    const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    for (size_t i = slot(key);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        *rank = s.rank;
        *id = s.id;
        return true;
      }
      if (s.key == kEmpty) return false;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Slot {
    uint64_t key;
    uint32_t rank;
    int32_t id;
  };
  size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> (64 - bits_)); }
  std::vector<Slot> slots_;
  int bits_ = 4;
};

// A model vocabulary: the tokens in one arena, indexed by id, and an open-addressing table
// from token to id (16-byte slots holding the arena span: a lookup reads two cache lines).
class TokenTable {
 public:
  // Fills the table from (token, id) pairs; refuses ids given twice, absurdly sparse ids and
  // more than 4 GB of tokens.
  void build(std::vector<std::pair<std::string_view, int32_t>>& entries, const Where& w);
  // The id of token `s`, -1 when it is not in the table.
  int32_t find(std::string_view s) const {
    const uint64_t h = hash(s);
    const auto tag = uint32_t(h >> 32);
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      const Slot& slot = slots_[i];
      if (slot.len == kAbsent) return -1;
      if (slot.tag == tag && slot.len == s.size() && std::memcmp(arena_.data() + slot.begin, s.data(), s.size()) == 0)
        return slot.id;
    }
  }
  bool has(int32_t id) const { return id >= 0 && size_t(id) < span_.size() && span_[id].len != kAbsent; }
  std::string_view token(int32_t id) const { return std::string_view(arena_).substr(span_[id].begin, span_[id].len); }
  size_t size() const { return size_; }
  int32_t max_id() const { return int32_t(span_.size()) - 1; }

 private:
  static constexpr uint32_t kAbsent = UINT32_MAX;
  static uint64_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }
  struct Span32 {
    uint32_t begin, len;
  };
  struct Slot {
    uint32_t tag = 0;
    int32_t id = -1;
    uint32_t begin = 0, len = kAbsent;  // len kAbsent: empty
  };
  std::string arena_;
  std::vector<Span32> span_;  // by id
  std::vector<Slot> slots_;
  size_t size_ = 0;
};


// The BPE model: the "model" object of tokenizer.json (both merges formats, ignore_merges,
// byte_fallback, unk_token, fuse_unk, continuing_subword_prefix, end_of_word_suffix; dropout
// null or 0), checked when it is read.
class Bpe {
 public:
  Bpe(const json& j, const Where& w);

  int32_t token_to_id(std::string_view t) const { return vocab_.find(t); }
  std::optional<std::string_view> id_to_token(int32_t id) const {
    if (!vocab_.has(id)) return std::nullopt;
    return vocab_.token(id);
  }
  size_t size() const { return vocab_.size(); }
  int32_t max_id() const { return vocab_.max_id(); }

  // Appends the ids of one pre-tokenized word to `out`.
  void tokenize(std::string_view word, BpeScratch& sc, std::vector<int32_t>& out) const;

 private:
  void parse_merges(const json& merges, const Where& w);
  int32_t char_id(std::string_view s, bool first, bool last, std::string& key) const;
  void merge_word(std::string_view w, BpeScratch& sc, std::vector<int32_t>& out) const;
  void build_symbols(std::string_view w, std::vector<Symbol>& sym) const;
  template <class Q>
  bool merge_symbols(std::vector<Symbol>& sym, Q& queue) const;

  // Words of this many symbols or more are merged with the RadixQueue.
  static constexpr size_t kRadixMinSymbols = 512;

  TokenTable vocab_;
  PairMap merges_;
  std::vector<int32_t> rank_new_id_;  // a rank's merged id (a queue entry holds only the rank)
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;
  std::string prefix_, suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_;
  std::vector<int32_t> bmp_ids_;  // single BMP code point -> id (-1: not in the vocab)
};

}  // namespace dhp::hf
