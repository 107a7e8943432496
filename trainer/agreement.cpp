#include "trainer/agreement.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/hash.h"
#include "data/shard_format.h"
#include "data/tokenizer.h"

namespace dhp {
namespace {

// A data path's contents as a hash: a built folder by its index (which holds every sample's
// checksums), a manifest or a tokenizer by its bytes; "" for no file.
std::string contents_hash(const std::string& path) {
  if (path.empty()) return "none";
  namespace fs = std::filesystem;
  const std::string file = fs::is_directory(path) ? (fs::path(path) / kIndexFile).string() : path;
  return fmt::format("{:016x}", hash_file(file));
}

// A tokenizer by the bytes of every file it reads (its model, the tokenizer_config.json of a
// tokenizer.json, an added_tokens.json beside it); a folder (a Hugging Face checkpoint's) by the
// tokenizer file it would read.
std::string tokenizer_contents_hash(const std::string& path) {
  std::string h;
  for (const std::string& file : tokenizer_input_files(path))
    h += fmt::format("{}{:016x}", h.empty() ? "" : " + ", hash_file(file));
  return h;
}

// Messages travel in a fixed-size buffer.
constexpr size_t kMessageBytes = 2048;

}  // namespace

std::vector<std::pair<std::string, std::string>> agreement_terms(const Config& cfg) {
  static const char* const kPerProcess[] = {"train.threads", "train.adapt_threads"};
  static const char* const kByContents[] = {"data.train", "data.val", "data.tokenizer"};
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [key, value] : config_entries(cfg)) {
    if (key.rfind("log.", 0) == 0 || key == "data.image_root") continue;
    if (std::find(std::begin(kPerProcess), std::end(kPerProcess), key) != std::end(kPerProcess)) continue;
    if (std::find(std::begin(kByContents), std::end(kByContents), key) != std::end(kByContents)) continue;
    out.emplace_back(key, value);
  }
  out.emplace_back("data.train (its contents)", contents_hash(cfg.data.train));
  out.emplace_back("data.val (its contents)", contents_hash(cfg.data.val));
  out.emplace_back("data.tokenizer (its contents)", tokenizer_contents_hash(cfg.data.tokenizer));
  return out;
}

void check_ranks_agree(const Config& cfg, Communicator& comm, const AgreementTerms& extra) {
  if (comm.size() == 1) return;
  // A rank that cannot even read its files takes part all the same, with its reason as its
  // terms, so that the others stop with it instead of waiting for it.
  AgreementTerms mine;
  try {
    mine = agreement_terms(cfg);
  } catch (const Error& e) {
    mine = {{"its data files", std::string("unreadable: ") + e.what()}};
  }
  mine.insert(mine.end(), extra.begin(), extra.end());
  check_terms_agree(mine, comm, "its configuration");
}

void check_terms_agree(const AgreementTerms& mine, Communicator& comm, const std::string& what) {
  if (comm.size() == 1) return;
  std::string text;
  for (const auto& [key, value] : mine) text += key + '\x1f' + value + '\x1e';
  // Rank 0's terms to everyone, then each rank's first differing term to everyone.
  int64_t n = int64_t(text.size());
  comm.broadcast(&n, 1, DataType::I64, 0);
  std::string theirs(size_t(n), '\0');
  if (comm.rank() == 0) theirs = text;
  comm.broadcast(theirs.data(), n, DataType::U8, 0);
  std::vector<std::pair<std::string, std::string>> ref;
  for (size_t at = 0; at < theirs.size();) {
    const size_t sep = theirs.find('\x1f', at), end = theirs.find('\x1e', at);
    DHP_ASSERT(sep != std::string::npos && end != std::string::npos && sep < end);
    ref.emplace_back(theirs.substr(at, sep - at), theirs.substr(sep + 1, end - sep - 1));
    at = end + 1;
  }
  std::string why;
  for (size_t i = 0; i < std::max(mine.size(), ref.size()) && why.empty(); ++i) {
    if (i < mine.size() && i < ref.size() && mine[i] == ref[i]) continue;
    if (i < mine.size() && i < ref.size() && mine[i].first == ref[i].first)
      why = fmt::format("rank {}: {} differs from rank 0's: {} = {} there, {} on rank 0", comm.rank(), what,
                        mine[i].first, mine[i].second, ref[i].second);
    else
      why = fmt::format("rank {}: {} differs from rank 0's at {} (another dhp version?)", comm.rank(), what,
                        i < mine.size() ? mine[i].first : ref[i].first);
  }
  std::vector<int32_t> differs(size_t(comm.size()));
  const int32_t me = why.empty() ? 0 : 1;
  comm.all_gather(&me, differs.data(), 1, DataType::I32);
  const auto first = std::find(differs.begin(), differs.end(), 1);
  if (first == differs.end()) return;
  const int root = int(first - differs.begin());
  std::string message(kMessageBytes, '\0');
  if (comm.rank() == root) std::memcpy(message.data(), why.data(), std::min(why.size(), kMessageBytes - 1));
  comm.broadcast(message.data(), int64_t(kMessageBytes), DataType::U8, root);
  message.resize(std::strlen(message.c_str()));
  const int others = int(std::count(differs.begin(), differs.end(), 1)) - 1;
  throw Error(others > 0 ? fmt::format("{} (and {} more rank{})", message, others, others > 1 ? "s" : "") : message);
}

std::string weights_fingerprint(const Model& model) {
  constexpr int64_t kEnds = 1024;
  // Where each rank holds the master of its own shard only, what all of them hold: the
  // working copy.
  const auto read = [&](int64_t offset, int64_t count, float* host) {
    if (model.sheds_master()) model.read_working(offset, count, host);
    else model.read_params(offset, count, host);
  };
  std::vector<float> host;
  uint64_t h = kFnvSeed;
  for (const ParamSpec& s : model.table().specs()) {
    const int64_t n = s.numel(), head = std::min(n, kEnds), tail = std::min(n - head, kEnds);
    host.resize(size_t(head + tail));
    read(s.offset, head, host.data());
    if (tail > 0) read(s.offset + n - tail, tail, host.data() + head);
    h = fnv1a(host.data(), host.size() * sizeof(float), h);
  }
  return fmt::format("{:016x}", h);
}

void agree_attention_choices(Backend& backend, Communicator& comm) {
  const std::vector<AttnTiming> mine = backend.take_attention_timings();
  int64_t n = int64_t(mine.size());
  comm.all_reduce(&n, 1, DataType::I64, ReduceOp::Max);
  if (n == 0) return;
  // Rows of (key..., own, lib, valid); ranks with fewer timings pad with invalid rows.
  constexpr int kRow = AttnTiming::kKey + 3;
  std::vector<double> send(size_t(n * kRow), 0.0), all(size_t(comm.size() * n * kRow));
  for (size_t i = 0; i < mine.size(); ++i) {
    double* r = &send[i * kRow];
    for (int k = 0; k < AttnTiming::kKey; ++k) r[k] = double(mine[i].key[k]);
    r[AttnTiming::kKey] = mine[i].own_s;
    r[AttnTiming::kKey + 1] = mine[i].lib_s;
    r[AttnTiming::kKey + 2] = 1;
  }
  comm.all_gather(send.data(), all.data(), n * kRow, DataType::F64);
  std::vector<AttnTiming> everyone;
  for (size_t i = 0; i < all.size(); i += kRow) {
    if (all[i + AttnTiming::kKey + 2] == 0) continue;
    AttnTiming t;
    for (int k = 0; k < AttnTiming::kKey; ++k) t.key[k] = int64_t(all[i + size_t(k)]);
    t.own_s = all[i + AttnTiming::kKey];
    t.lib_s = all[i + AttnTiming::kKey + 1];
    everyone.push_back(t);
  }
  backend.agree_attention(everyone);
}

}  // namespace dhp
