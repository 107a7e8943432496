// A small synthesized data set and a small model configuration for end-to-end tests.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/synth.h"
#include "trainer/config.h"

namespace dhp::testing {

// A data set synthesized into a private temporary folder, removed when the process exits. The
// folder is made by mkdtemp, not named by the pid alone: a process killed before its exit leaves
// its folder behind, and a later test given the same pid must not find it there.
struct TempDataSet {
  std::filesystem::path path;
  TempDataSet(const std::string& tag, SynthOptions o) {
    std::string name = (std::filesystem::temp_directory_path() / (tag + "XXXXXX")).string();
    if (::mkdtemp(name.data()) == nullptr) throw std::runtime_error("mkdtemp " + name + " failed");
    path = name;
    o.out_dir = path.string();
    synthesize(o);
  }
  ~TempDataSet() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The small captioning set, synthesized once per test process.
inline const std::filesystem::path& synth_dir() {
  static const TempDataSet dir("dhp_test_data_", [] {
    SynthOptions o;
    o.train = 240;
    o.val = 48;
    o.seed = 3;
    o.min_side = 32;
    o.max_side = 96;
    return o;
  }());
  return dir.path;
}

// A fresh, empty folder for one test's run outputs.
inline std::filesystem::path run_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("dhp_test_run_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

inline const char* kSmallModelToml =
    "[model]\ndim = 64\nlayers = 2\nheads = 4\nkv_heads = 2\nffn = 128\nvocab_size = 160\n"
    "[model.vision]\npatch = 8\ndim = 32\nlayers = 1\nheads = 2\nffn = 64\nmerge = 2\n"
    "min_pixels = 1024\nmax_pixels = 4096\n"
    "[train]\nbatch_size = 16\nseed = 11\nthreads = 2\n"
    "[optim]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup = 5\n"
    "[eval]\nblank_images = true\n"
    "[log]\nmetrics = \"\"\nprogress = false\nlevel = \"warn\"\n";

inline Config small_config(int64_t steps, const std::filesystem::path& out,
                           std::vector<std::string> extra = {}) {
  const std::string d = synth_dir().string();
  std::vector<std::string> o = {
      "--train.steps=" + std::to_string(steps), "--data.train=" + d + "/train.jsonl",
      "--data.val=" + d + "/val.jsonl", "--data.tokenizer=" + d + "/tokenizer.model",
      "--checkpoint.dir=" + (out / "checkpoints").string()};
  o.insert(o.end(), extra.begin(), extra.end());
  return parse_config(kSmallModelToml, "test.toml", o);
}

}  // namespace dhp::testing
