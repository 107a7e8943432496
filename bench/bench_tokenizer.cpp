// Encode throughput of dhp's HfTokenizer (data/hf_tokenizer.h) against Hugging Face's Rust
// `tokenizers` (the Node addon that scripts/fetch_references.sh fetches), on the corpus of
// tests/reference/make_tokenizer_corpus.py, one thread each:
//   dhp: CPU time of the encoding thread (CLOCK_THREAD_CPUTIME_ID), median of --repeats;
//   hf:  wall time measured inside Node around encodeBatch calls of 256 lines with
//        RAYON_NUM_THREADS=1 (tests/reference/hf_tokenize.js time), median of --repeats; it
//        includes the addon's JS <-> Rust string copies and its offset bookkeeping.
// Then linear time on single huge lines: a line of random letters without spaces (one
// pre-token: a 10 MB BPE word for the SentencePiece-style files, one \p{L}+ match for the
// byte-level ones) and one character unknown to every vocabulary (U+10D50, byte fallback or
// byte-level pieces) repeated: seconds per MB at 1 MB and 10 MB should be about equal.
// Prints tables; asserts nothing.
//
//   bench_tokenizer [--refs DIR] [--repeats 3] [--only qwen3,...] [--no-hf] [--long-mb 10]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/timing.h"
#include "core/check.h"
#include "core/clock.h"
#include "data/hf_tokenizer.h"

namespace {

namespace fs = std::filesystem;
using dhp::HfTokenizer;

using dhp::thread_cpu_seconds;
using dhp::bench::median;

std::string run_output(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  return pclose(p) == 0 ? out : std::string();
}

// Median seconds per encode of all `texts`, and their bytes.
double dhp_seconds(const HfTokenizer& tok, const std::vector<std::string>& texts, int repeats) {
  std::vector<double> s;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = thread_cpu_seconds();
    size_t ids = 0;
    for (const auto& t : texts) ids += tok.encode(t, false).size();
    s.push_back(thread_cpu_seconds() - t0);
    DHP_CHECK(ids > 0, "no ids");
  }
  return median(s);
}

// The library's median seconds for `corpus` (JSON lines), or a negative value when it cannot run.
double hf_seconds(const fs::path& script, const fs::path& tokenizer, const fs::path& corpus, int repeats) {
  const std::string out = run_output(fmt::format("RAYON_NUM_THREADS=1 node {} time {} {} --repeats {}", script.string(),
                                                 tokenizer.string(), corpus.string(), repeats));
  if (out.empty()) return -1;
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  return median(j["seconds"].get<std::vector<double>>());
}

std::string random_letters(size_t n) {
  std::string s(n, 'a');
  uint64_t x = 88172645463325252ull;
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = char('a' + x % 26);
  }
  return s;
}

std::string repeated(const std::string& unit, size_t bytes) {
  std::string s;
  s.reserve(bytes);
  while (s.size() + unit.size() <= bytes) s += unit;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"HfTokenizer encode throughput against Hugging Face tokenizers, and linear time on huge lines"};
  std::string refs = std::string(DHP_SOURCE_DIR) + "/.cache/references";
  int repeats = 3;
  std::vector<std::string> only = {"qwen3", "llama3_1", "llama3", "deepseek_v3", "gemma3", "llama2"};
  bool no_hf = false;
  int long_mb = 10;
  app.add_option("--refs", refs, "folder of scripts/fetch_references.sh");
  app.add_option("--repeats", repeats, "timed repetitions (the median is printed)")->check(CLI::Range(1, 50));
  app.add_option("--only", only, "tokenizers to run")->delimiter(',');
  app.add_flag("--no-hf", no_hf, "skip the Hugging Face timings");
  app.add_option("--long-mb", long_mb, "size of the huge lines")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  try {
    const fs::path source = DHP_SOURCE_DIR;
    const fs::path script = source / "tests/reference/hf_tokenize.js";
    const fs::path tmp = fs::temp_directory_path() / ("dhp_bench_tokenizer_" + std::to_string(::getpid()));
    fs::create_directories(tmp);
    const fs::path corpus = tmp / "corpus.jsonl";
    const std::string gen = "/usr/bin/python3 " + (source / "tests/reference/make_tokenizer_corpus.py").string() + " " +
                            corpus.string() + " 2>/dev/null";
    DHP_CHECK(std::system(gen.c_str()) == 0, "{} failed", gen);
    std::vector<std::string> texts;
    size_t bytes = 0;
    {
      std::ifstream in(corpus);
      for (std::string line; std::getline(in, line);) {
        texts.push_back(nlohmann::json::parse(line).get<std::string>());
        bytes += texts.back().size();
      }
    }
    const bool hf = !no_hf && fs::exists(fs::path(refs) / "tokenizers-node" / "tokenizers.node");
    fmt::print("corpus: {} lines, {:.2f} MB of UTF-8; dhp: thread CPU time; hf: {}; median of {}\n\n", texts.size(),
               bytes / 1e6, hf ? "Node wall time, RAYON_NUM_THREADS=1" : "not run", repeats);
    fmt::print("{:<12} {:>8} {:>10} {:>10} {:>8}\n", "tokenizer", "load s", "dhp MB/s", "hf MB/s", "dhp/hf");

    const std::string no_spaces = random_letters(size_t(long_mb) << 20);
    const std::string unknown = repeated("\xF0\x90\xB5\x90", size_t(long_mb) << 20);  // U+10D50
    // Three sizes of each huge line: time per MB that stays flat is linear; a quadratic
    // step would multiply it by the size ratio.
    std::vector<size_t> mbs = {1, size_t(std::clamp(long_mb / 4, 1, long_mb)), size_t(long_mb)};
    mbs.erase(std::unique(mbs.begin(), mbs.end()), mbs.end());
    struct Long {
      std::string name;
      std::vector<double> per_mb;
    };
    std::vector<std::pair<std::string, std::vector<Long>>> longs;
    for (const auto& name : only) {
      const fs::path file = fs::path(refs) / name / "tokenizer.json";
      if (!fs::exists(file)) {
        fmt::print("{:<12} (no {}: run scripts/fetch_references.sh)\n", name, file.string());
        continue;
      }
      const double t0 = thread_cpu_seconds();
      const auto tok = HfTokenizer::load(file.string());
      const double load = thread_cpu_seconds() - t0;
      dhp_seconds(*tok, texts, 1);  // warm the word cache, as the library's is warm after its first repeat
      const double mine = dhp_seconds(*tok, texts, repeats);
      const double theirs = hf ? hf_seconds(script, file, corpus, repeats) : -1;
      fmt::print("{:<12} {:>8.2f} {:>10.2f} {:>10} {:>8}\n", name, load, bytes / 1e6 / mine,
                 theirs > 0 ? fmt::format("{:.2f}", bytes / 1e6 / theirs) : "-",
                 theirs > 0 ? fmt::format("{:.1f}x", theirs / mine) : "-");
      std::fflush(stdout);
      std::vector<Long> rows;
      for (const auto& [label, text] : {std::pair<std::string, const std::string*>{"no spaces", &no_spaces},
                                        std::pair<std::string, const std::string*>{"U+10D50 run", &unknown}}) {
        Long l{label, {}};
        for (size_t mb : mbs) {
          const std::vector<std::string> line = {text->substr(0, mb << 20)};
          l.per_mb.push_back(dhp_seconds(*tok, line, repeats) / double(mb));
        }
        rows.push_back(l);
      }
      longs.emplace_back(name, rows);
    }
    fmt::print("\nhuge single lines, dhp seconds per MB, median of {} (linear time: the columns about equal; "
               "quadratic: growing with the size)\n", repeats);
    fmt::print("{:<12} {:<12}", "tokenizer", "line");
    for (size_t mb : mbs) fmt::print(" {:>10}", fmt::format("{} MB", mb));
    fmt::print(" {:>10}\n", "last/first");
    for (const auto& [name, rows] : longs)
      for (const auto& l : rows) {
        fmt::print("{:<12} {:<12}", name, l.name);
        for (double s : l.per_mb) fmt::print(" {:>10.3f}", s);
        fmt::print(" {:>9.2f}x\n", l.per_mb.back() / l.per_mb.front());
      }
    fs::remove_all(tmp);
  } catch (const dhp::Error& e) {
    fmt::print(stderr, "bench_tokenizer: {}\n", e.what());
    return 1;
  }
  return 0;
}
