// The BPE model; see bpe.h. Merging follows models/bpe/model.rs and word.rs of Hugging Face
// `tokenizers` step for step, so that ties and unknown characters come out as the library's.
#include "data/hf/bpe.h"

#include <fmt/format.h>

#include "core/text.h"
#include "data/hf/unicode.h"

namespace dhp::hf {

void TokenTable::build(std::vector<std::pair<std::string_view, int32_t>>& entries, const Where& w) {
  int32_t max_id = -1;
  for (const auto& e : entries) max_id = std::max(max_id, e.second);
  // Ids index tables; refuse absurdly sparse ones rather than allocating gigabytes.
  if (int64_t(max_id) + 1 > 16 * int64_t(entries.size()) + 65536)
    w.fail("ids up to {} for {} tokens are too sparse", max_id, entries.size());
  span_.assign(size_t(max_id + 1), {0, kAbsent});
  size_t bytes = 0;
  for (const auto& e : entries) bytes += e.first.size();
  if (bytes >= UINT32_MAX) w.fail("the tokens take more than 4 GB");
  arena_.reserve(bytes);
  for (const auto& [token, id] : entries) {
    if (span_[id].len != kAbsent)
      w.fail("id {} is given to both \"{}\" and \"{}\"", id, printable(this->token(id), 60), printable(token, 60));
    span_[id] = {uint32_t(arena_.size()), uint32_t(token.size())};
    arena_.append(token);
  }
  size_t cap = 16;
  while (cap < 2 * entries.size()) cap *= 2;
  slots_.assign(cap, Slot{});
  for (const auto& [token, id] : entries) {
    const uint64_t h = hash(token);
    size_t i = h & (cap - 1);
    while (slots_[i].len != kAbsent) i = (i + 1) & (cap - 1);
    slots_[i] = {uint32_t(h >> 32), id, span_[id].begin, span_[id].len};
  }
  size_ = entries.size();
}

Bpe::Bpe(const json& j, const Where& w) {
  need_object(j, w);
  if (const json* t = find_key(j, "type"); t && !(t->is_string() && t->get<std::string>() == "BPE"))
    w.at("type").fail("unsupported model {} (only BPE)", describe(*t));
  if (const json* d = find_key(j, "dropout"); d && !d->is_null() && !(d->is_number() && d->get<double>() == 0.0))
    w.at("dropout").fail("BPE dropout {} is not supported (must be null: encoding must be deterministic)", describe(*d));
  unk_token_ = get_optional_string(j, "unk_token", w);
  prefix_ = get_optional_string(j, "continuing_subword_prefix", w).value_or("");
  suffix_ = get_optional_string(j, "end_of_word_suffix", w).value_or("");
  fuse_unk_ = get_bool(j, "fuse_unk", false, w);
  byte_fallback_ = get_bool(j, "byte_fallback", false, w);
  ignore_merges_ = get_bool(j, "ignore_merges", false, w);

  const json& vocab = need(j, "vocab", w);
  if (!vocab.is_object()) w.at("vocab").fail("expected an object of token: id, found {}", describe(vocab));
  std::vector<std::pair<std::string_view, int32_t>> entries;
  entries.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    const Where wt = w.at("vocab").at(printable(token, 60));
    const int32_t v = int32_t(get_uint(id, wt));
    if (first_invalid(token) != token.size()) wt.fail("the token is not valid UTF-8");
    entries.emplace_back(token, v);
  }
  vocab_.build(entries, w.at("vocab"));
  if (unk_token_) {
    unk_id_ = vocab_.find(*unk_token_);
    if (unk_id_ < 0) w.at("unk_token").fail("\"{}\" is not in the vocab", printable(*unk_token_, 60));
  }
  for (int b = 0; b < 256; ++b) byte_ids_[b] = vocab_.find(fmt::format("<0x{:02X}>", b));
  bmp_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : entries) {
    size_t n;
    if (!token.empty() && token.size() <= 3 && decode_at(token, 0, &n) < 0x10000 && n == token.size())
      bmp_ids_[decode_at(token, 0, &n)] = id;
  }
  parse_merges(need(j, "merges", w), w.at("merges"));
}

void Bpe::tokenize(std::string_view word, BpeScratch& sc, std::vector<int32_t>& out) const {
  const bool cacheable = word.size() < WordCache::kMaxWordBytes;
  const uint64_t h = cacheable ? WordCache::hash(word) : 0;
  if (cacheable && sc.cache.get(word, h, out)) return;
  sc.word_ids.clear();
  if (const int32_t id = ignore_merges_ ? vocab_.find(word) : -1; id >= 0) {
    sc.word_ids.push_back(id);  // ignore_merges: a word in the vocab is one token
  } else {
    merge_word(word, sc, sc.word_ids);
  }
  if (cacheable) sc.cache.put(word, h, sc.word_ids.data(), sc.word_ids.size());
  out.insert(out.end(), sc.word_ids.begin(), sc.word_ids.end());
}

void Bpe::parse_merges(const json& merges, const Where& w) {
  if (!merges.is_array()) w.fail("expected an array, found {}", describe(merges));
  merges_.reserve(merges.size());
  uint32_t rank = 0;
  std::string a, b;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {  // "a b" (merges.txt lines; "#version" lines are skipped)
      const std::string& s = m.get_ref<const std::string&>();
      if (s.starts_with("#version")) continue;
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        w.at(i).fail("expected \"a b\" (two tokens and one space), found {}", describe(m));
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      w.at(i).fail("expected \"a b\" or [\"a\", \"b\"], found {}", describe(m));
    }
    const int32_t ia = token_to_id(a), ib = token_to_id(b);
    if (ia < 0) w.at(i).fail("\"{}\" is not in the vocab", printable(a, 60));
    if (ib < 0) w.at(i).fail("\"{}\" is not in the vocab", printable(b, 60));
    if (b.size() < prefix_.size()) w.at(i).fail("\"{}\" is shorter than continuing_subword_prefix", printable(b, 60));
    const std::string merged = a + b.substr(prefix_.size());
    const int32_t im = token_to_id(merged);
    if (im < 0) w.at(i).fail("the merged token \"{}\" is not in the vocab", printable(merged, 60));
    merges_.insert_or_assign(ia, ib, rank++, im);
    rank_new_id_.push_back(im);
  }
}

int32_t Bpe::char_id(std::string_view s, bool first, bool last, std::string& key) const {
  if ((first || prefix_.empty()) && (!last || suffix_.empty())) {
    size_t n;
    const char32_t c = decode_at(s, 0, &n);
    if (c < 0x10000) return bmp_ids_[c];
    return token_to_id(s);
  }
  key.clear();
  if (!first) key += prefix_;
  key.append(s);
  if (last) key += suffix_;
  return token_to_id(key);
}

// models/bpe/model.rs merge_word + word.rs merge_all, step for step.
void Bpe::merge_word(std::string_view w, BpeScratch& sc, std::vector<int32_t>& out) const {
  std::vector<Symbol>& sym = sc.symbols;
  build_symbols(w, sym);
  bool merged = false;
  if (sym.size() >= kRadixMinSymbols) {
    merged = merge_symbols(sym, sc.radix);
    if (!merged) build_symbols(w, sym);  // merges out of training order: start again
  }
  if (!merged) merge_symbols(sym, sc.queue);
  for (const Symbol& s : sym)
    if (s.len != 0) out.push_back(s.id);
}

// The word's characters as symbols: vocab ids, byte fallback, unk.
void Bpe::build_symbols(std::string_view w, std::vector<Symbol>& sym) const {
  sym.clear();
  const auto add = [&](int32_t id, uint32_t len) {
    const int32_t n = int32_t(sym.size());
    if (n > 0) sym.back().next = n;
    sym.push_back({id, n - 1, -1, len});
  };
  int32_t unk = -1;  // a pending unk token (id) and its length
  uint32_t unk_len = 0;
  std::string key;
  for (size_t i = 0; i < w.size();) {
    const size_t n = char_len(static_cast<unsigned char>(w[i]));
    const std::string_view s = w.substr(i, n);
    const bool first = i == 0, last = i + n == w.size();
    i += n;
    const int32_t id = char_id(s, first, last, key);
    if (id >= 0) {
      if (unk >= 0) add(unk, unk_len);
      unk = -1;
      add(id, uint32_t(n));
      continue;
    }
    if (byte_fallback_) {
      // The bytes of the looked-up string (prefix and suffix included), if all have tokens;
      // a pending unk is not flushed first (as in the library).
      const std::string_view bytes = (first || prefix_.empty()) && (!last || suffix_.empty()) ? s : std::string_view(key);
      if (std::all_of(bytes.begin(), bytes.end(), [&](char b) { return byte_ids_[static_cast<unsigned char>(b)] >= 0; })) {
        for (char b : bytes) add(byte_ids_[static_cast<unsigned char>(b)], 1);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (unk >= 0 && fuse_unk_) {
        unk_len += uint32_t(n);
      } else {
        if (unk >= 0) add(unk, unk_len);
        unk = unk_id_;
        unk_len = uint32_t(n);
      }
    }
    // no unk_token: the character is dropped, as in the library
  }
  if (unk >= 0) add(unk, unk_len);
}

// word.rs merge_all with the queue Q; false when Q cannot take a key (RadixQueue).
template <class Q>
bool Bpe::merge_symbols(std::vector<Symbol>& sym, Q& queue) const {
  queue.clear();
  uint32_t rank;
  int32_t new_id;
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (merges_.find(sym[k].id, sym[k + 1].id, &rank, &new_id)) queue.add_unordered(MergeQueue::key(rank, uint32_t(k)));
  queue.make();
  while (!queue.empty()) {
    const uint64_t top = queue.pop();
    const uint32_t top_rank = uint32_t(top >> 32), pos = uint32_t(top);
    const int32_t top_id = rank_new_id_[top_rank];
    Symbol& cur = sym[pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const Symbol right = sym[cur.next];
    // An expired entry: the pair there no longer merges into this id.
    if (!merges_.find(cur.id, right.id, &rank, &new_id) || new_id != top_id) continue;
    sym[cur.next].len = 0;
    cur.id = top_id;
    cur.len += right.len;
    cur.next = right.next;
    if (right.next >= 0) sym[right.next].prev = int32_t(pos);
    if (cur.prev >= 0 && merges_.find(sym[cur.prev].id, cur.id, &rank, &new_id) &&
        !queue.push(MergeQueue::key(rank, uint32_t(cur.prev))))
      return false;
    if (cur.next >= 0 && merges_.find(cur.id, sym[cur.next].id, &rank, &new_id) && !queue.push(MergeQueue::key(rank, pos)))
      return false;
  }
  return true;
}

}  // namespace dhp::hf
