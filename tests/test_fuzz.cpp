// Fuzz-style robustness: hundreds of mutated configuration files, manifest lines and
// safetensors headers go through the real parsers. Each must end in success or a dhp::Error
// (a LineError for a manifest line); any other exception fails the test, and a crash or a
// hang kills the test process, which ctest reports. Mutations are seeded, so a failure
// reproduces; the failing input is printed.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "data/manifest.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "tests/train_fixture.h"
#include "trainer/config.h"
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

}  // namespace
}  // namespace dhp
