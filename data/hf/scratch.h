// Per-call scratch of the Hugging Face tokenizer (data/hf_tokenizer.h): the PCRE2 match state
// and the buffers of every stage of encode and decode, pooled so that a loaded tokenizer stays
// immutable and encode is reentrant. A caller borrows one Scratch for the whole call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "data/hf/bpe.h"
#include "data/hf/regex.h"

namespace dhp::hf {

// An occurrence of an added token (index into the token list) found in a text.
struct AddedMatch {
  size_t begin, end;
  int32_t token;
};
// A piece of text after cutting out added tokens: `id` >= 0 for an added token.
struct Piece {
  size_t begin, end;
  int32_t id;
};

struct Scratch {
  MatchState match;
  BpeScratch bpe;
  // One of each per pre-tokenizer stage (the stages run depth-first, each using its own).
  std::vector<std::string> stage_text;
  std::vector<std::vector<Span>> stage_spans;
  std::vector<std::vector<std::pair<Span, bool>>> stage_matches;
  std::vector<std::vector<Span>> stage_regex;
  // Replace's
  std::vector<Span> replace_regex;
  std::vector<std::pair<Span, bool>> replace_matches;
  std::string replace_out;
  // encode's own
  std::vector<AddedMatch> added_matches;
  std::vector<Piece> raw_pieces, norm_pieces;
  std::string normalized;
};

class ScratchPool {
 public:
  class Lease {
   public:
    Lease(ScratchPool* pool, std::unique_ptr<Scratch> s) : pool_(pool), s_(std::move(s)) {}
    ~Lease() { pool_->put(std::move(s_)); }
    Scratch& operator*() { return *s_; }

   private:
    ScratchPool* pool_;
    std::unique_ptr<Scratch> s_;
  };
  Lease get() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        auto s = std::move(free_.back());
        free_.pop_back();
        return Lease(this, std::move(s));
      }
    }
    return Lease(this, std::make_unique<Scratch>());
  }

 private:
  void put(std::unique_ptr<Scratch> s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(s));
  }
  std::mutex mu_;
  std::vector<std::unique_ptr<Scratch>> free_;
};

}  // namespace dhp::hf
