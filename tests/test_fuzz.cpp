// Fuzz-style robustness: hundreds of mutated configuration files, manifest lines and
// safetensors headers go through the real parsers. Each must end in success or a dhp::Error
// (a LineError for a manifest line); any other exception fails the test, and a crash or a
// hang kills the test process, which ctest reports. Mutations are seeded, so a failure
// reproduces; the failing input is printed.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "data/manifest.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "tests/hf_fixture.h"
#include "tests/train_fixture.h"
#include "trainer/config.h"
#include "trainer/hf_checkpoint.h"
#include "trainer/weights.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;

constexpr int kMutants = 300;  // per parser: enough to reach every branch many times over

// Fragments that parsers treat specially: delimiters, quotes, escapes, extreme numbers.
const std::vector<std::string> kTokens = {
    "\"", "'", "[", "]", "{", "}", ",", ":", "=", "\n", "\\", "\\u0000", std::string(1, '\0'),
    "\xff", "\xc3", "nan", "inf", "-inf", "1e999", "-1", "0", "-0.5", "1.5", "9223372036854775807",
    "18446744073709551615", "true", "null", "[[x]]", "[model]", "<image>", "../", "/etc/passwd",
    "\"image\": [", "\"images\": 5", "\"conversations\": []", "\"data_offsets\": [0.5, 1]",
    "\"shape\": [-1]", "\"dtype\": \"F64\""};

std::string mutate(std::string s, Rng& rng) {
  const int n = int(rng.range(1, 4));
  for (int m = 0; m < n; ++m) {
    const size_t at = s.empty() ? 0 : size_t(rng.below(s.size() + 1));
    switch (rng.below(5)) {
      case 0:  // overwrite a byte
        if (!s.empty()) s[std::min(at, s.size() - 1)] = char(rng.below(256));
        break;
      case 1:  // delete a short range
        s.erase(at, size_t(rng.range(1, 8)));
        break;
      case 2:  // insert a special fragment
        s.insert(at, kTokens[size_t(rng.below(kTokens.size()))]);
        break;
      case 3: {  // duplicate a chunk
        const size_t len = size_t(rng.range(1, 32));
        s.insert(at, s.substr(at, len));
        break;
      }
      default:  // truncate
        s.resize(at);
    }
  }
  return s;
}

std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += c >= 0x20 && c < 0x7f ? std::string(1, char(c)) : fmt::format("\\x{:02x}", c);
  return out;
}

TEST(Fuzz, ConfigFilesAndOverrides) {
  std::ifstream in(std::string(DHP_SOURCE_DIR) + "/configs/demo.toml");
  std::stringstream demo;
  demo << in.rdbuf();
  const std::vector<std::string> seeds = {demo.str(), to_toml(parse_config("", "defaults"))};
  Rng rng(13);
  int ok = 0, refused = 0;
  for (int i = 0; i < kMutants; ++i) {
    const std::string text = mutate(seeds[size_t(i) % seeds.size()], rng);
    const std::string override = mutate("--optim.lr=1e-3", rng);
    try {
      parse_config(text, "fuzz.toml", {override});
      ++ok;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutant " << i << " escaped as " << e.what() << ":\n" << printable(text)
                    << "\noverride: " << printable(override);
    }
  }
  EXPECT_GT(refused, 0);
  RecordProperty("accepted", ok);
}

TEST(Fuzz, ManifestLines) {
  const fs::path& d = testing::synth_dir();
  std::ifstream in(d / "train.jsonl");
  std::vector<std::string> seeds;
  for (std::string line; std::getline(in, line) && seeds.size() < 8;) seeds.push_back(line);
  ASSERT_FALSE(seeds.empty());
  Tokenizer tok((d / "tokenizer.model").string());
  LineRules rules;
  rules.image_root = d;
  Rng rng(17);
  int ok = 0, refused = 0;
  for (int i = 0; i < kMutants; ++i) {
    const std::string line = mutate(seeds[size_t(i) % seeds.size()], rng);
    try {
      const ParsedLine p = parse_line(line, i + 1, tok, rules);
      for (size_t k = 0; k < p.paths.size(); ++k) read_line_image(p, k, nullptr);
      ++ok;
    } catch (const LineError&) {
      ++refused;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutant " << i << " escaped as " << e.what() << ":\n" << printable(line);
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(ok, 0);  // some mutants (a changed caption word) stay valid lines
}

TEST(Fuzz, SafetensorsHeaders) {
  const fs::path dir = testing::run_dir("fuzz_safetensors");
  const Config cfg = testing::small_config(1, dir);
  auto backend = make_cpu_backend({1});
  Model m(cfg.model, *backend);
  m.initialise(1);
  export_safetensors(m, cfg, (dir / "seed.safetensors").string(), (dir / "config.json").string());
  std::ifstream in(dir / "seed.safetensors", std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header = bytes.substr(8, n), data = bytes.substr(8 + n);
  Rng rng(19);
  int refused = 0;
  for (int i = 0; i < kMutants; ++i) {
    const std::string h = mutate(header, rng);
    uint64_t len = h.size();
    if (rng.below(8) == 0) len = rng.next();  // sometimes a length that lies
    std::string file(reinterpret_cast<const char*>(&len), 8);
    file += h + data;
    const fs::path path = dir / "mutant.safetensors";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
    try {
      load_weights(path.string(), m);
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutant " << i << " escaped as " << e.what() << ":\n" << printable(h);
    }
  }
  EXPECT_GT(refused, 0);
}

// Hugging Face folders: 2,100 mutants of config.json (a decoder's and a LLaVA's, nested
// configs included), the shard index, a shard's safetensors header (with lying lengths),
// added_tokens.json and preprocessor_config.json, each read as a run reads a folder: its
// configs applied, its tensors checked against them and imported into the model. Each runs in a
// child process whose address space may grow by at most twice the folder's size (RLIMIT_AS,
// plus a fixed 48 MiB for the allocator's and parser's own working room), so a size the
// input claims can never be allocated. Every mutant must end in success or a dhp::Error:
// another exception, a signal (stack overflow, SIGBUS, SIGSEGV) or the limit fails the test.
TEST(Fuzz, HuggingFaceFolders) {
  const fs::path work = testing::run_dir("fuzz_hf");
  const std::string dec = "--hidden 32 --heads 4 --kv 2 --layers 1 --ffn 48 --vocab 320";
  for (const auto& [script, name, args] : {std::tuple{"make_hf_fixture.py", "decoder", dec + " --tokenizer"},
                                           std::tuple{"make_hf_fixture.py", "sharded", dec + " --shards 3"},
                                           std::tuple{"make_hf_llava_fixture.py", "llava", std::string("llava_hf --tower clip")}})
    ASSERT_EQ(std::system(testing::fixture_command(script, work / name, args).c_str()), 0);
  // The tokenizer's added tokens, after its 300 pieces.
  std::ofstream(work / "decoder" / "added_tokens.json") << "{\"<image>\": 300, \"<pad>\": 301}";
  struct Target {
    const char* folder;
    const char* file;
    bool safetensors_header;
  };
  const Target targets[] = {{"decoder", "config.json", false},
                            {"llava", "config.json", false},
                            {"sharded", "model.safetensors.index.json", false},
                            {"sharded", "model-00002-of-00003.safetensors", true},
                            {"decoder", "model.safetensors", true},
                            {"decoder", "added_tokens.json", false},
                            {"llava", "preprocessor_config.json", false}};
  const auto folder_bytes = [](const fs::path& d) {
    int64_t n = 0;
    for (const auto& e : fs::directory_iterator(d)) n += int64_t(e.file_size());
    return n;
  };
  // Fragments of JSON a hostile file would hold, beyond mutate()'s.
  const std::vector<std::string> json_bits = {
      std::string(4000, '['), "{\"a\":" + std::string(100, '{'), "1e308", "-1e308", "4294967296",
      "18446744073709551616", "\"\\u0000\"", "[1,2,3]", "{}", "\"x\"", "-9223372036854775808",
      "true", "0.5", "\"" + std::string(70000, 'z') + "\""};
  // What a run does with a folder: its configs applied, its tensors checked and imported.
  const auto read_as_a_run = [&](const fs::path& folder, bool tokenizer) {
    const std::string f = folder.string();
    std::vector<std::string> extra = {"--model.init=" + f, "--train.threads=1"};
    if (tokenizer) extra.push_back("--data.tokenizer=" + f);
    Config cfg = testing::small_config(0, work, extra);
    apply_hf_init(cfg);
    auto backend = make_cpu_backend({1});
    Model m(cfg.model, *backend);
    m.initialise(1);
    import_hf_checkpoint(cfg.model.init, m);
    if (tokenizer) Tokenizer tok(f);
  };
  // Once here on each intact folder: the data set is made, and the children inherit every
  // symbol already bound, instead of each resolving them again.
  for (const char* f : {"decoder", "sharded", "llava"}) read_as_a_run(work / f, std::string(f) == "decoder");
  Rng rng(23);
  constexpr int kFolderMutants = 2100;
  int ok = 0, refused = 0;
  for (int i = 0; i < kFolderMutants; ++i) {
    const Target& t = targets[size_t(i) % std::size(targets)];
    const fs::path folder = work / t.folder;
    const fs::path file = folder / t.file;
    std::string original;
    {
      std::ifstream in(file, std::ios::binary);
      original.assign(std::istreambuf_iterator<char>(in), {});
    }
    std::string mutant;
    if (t.safetensors_header) {
      uint64_t n = 0;
      std::memcpy(&n, original.data(), 8);
      std::string h = mutate(original.substr(8, n), rng);
      if (rng.below(3) == 0) h.insert(size_t(rng.below(h.size() + 1)), json_bits[size_t(rng.below(json_bits.size()))]);
      uint64_t len = h.size();
      if (rng.below(6) == 0) len = rng.below(4) == 0 ? rng.next() : len + rng.below(1 << 20);  // a length that lies
      mutant.assign(reinterpret_cast<const char*>(&len), 8);
      mutant += h + original.substr(8 + n);
    } else {
      mutant = mutate(original, rng);
      if (rng.below(2) == 0) {
        // A value replaced by a hostile one, at a random key's value position.
        const size_t colon = mutant.find(':', size_t(rng.below(mutant.size() + 1)));
        if (colon != std::string::npos) mutant.insert(colon + 1, json_bits[size_t(rng.below(json_bits.size()))] + ",");
      }
    }
    std::ofstream(file, std::ios::binary | std::ios::trunc) << mutant;
    const int64_t limit_growth = 2 * folder_bytes(folder) + (int64_t(48) << 20);
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The limit: what the child has mapped now, plus the growth allowed.
      std::ifstream status("/proc/self/status");
      int64_t vm_kb = 0;
      for (std::string line; std::getline(status, line);)
        if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoll(line.substr(7));
      const rlimit lim{rlim_t(vm_kb * 1024 + limit_growth), rlim_t(vm_kb * 1024 + limit_growth)};
      ::setrlimit(RLIMIT_AS, &lim);
      int code = 0;
      try {
        read_as_a_run(folder, std::string(t.folder) == "decoder");
      } catch (const Error&) {
        code = 1;
      } catch (const std::bad_alloc&) {
        code = 3;  // the limit: an allocation the input drove
      } catch (...) {
        code = 2;
      }
      ::_exit(code);
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    std::ofstream(file, std::ios::binary | std::ios::trunc) << original;
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 1)) {
      (WEXITSTATUS(st) == 0 ? ok : refused) += 1;
      continue;
    }
    const std::string why = WIFSIGNALED(st) ? fmt::format("signal {}", WTERMSIG(st))
                            : WEXITSTATUS(st) == 3 ? std::string("an allocation past the memory limit")
                                                   : std::string("an exception that is not a dhp::Error");
    ADD_FAILURE() << "mutant " << i << " of " << t.folder << "/" << t.file << " ended in " << why << ":\n"
                  << printable(mutant.substr(0, 2000));
    std::ofstream(work / fmt::format("failing_{}_{}", i, t.file), std::ios::binary) << mutant;
  }
  EXPECT_GT(refused, kFolderMutants / 4);
  EXPECT_GT(ok, 0);  // some mutants (a changed digit of a tensor's values) still load
  RecordProperty("accepted", ok);
  fs::remove_all(work);
}

}  // namespace
}  // namespace dhp
