// A small synthesized data set and a small model configuration for end-to-end tests.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// A data set synthesized once per build of a test executable and shared by its processes
// (ctest runs every test case in a process of its own, and synthesizing in each cost about
// 0.6 s of CPU, a minute of the suite). It lives beside the executable (build/tests/.test_data),
// keyed by the executable's name, size and time, so a rebuild synthesizes anew and removes the
// set of the build before; it is made in a temporary folder and renamed into place, so no
// process sees a set half written. Tests read it and may add files of their own to it.
inline std::filesystem::path shared_data_set(const std::string& tag, SynthOptions o) {
  namespace fs = std::filesystem;
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  std::error_code ec;
  const auto size = fs::file_size(exe, ec);
  const auto time = fs::last_write_time(exe, ec).time_since_epoch().count();
  const std::string prefix = tag + exe.filename().string() + "-";
  const fs::path root = exe.parent_path() / ".test_data";
  const fs::path set = root / (prefix + std::to_string(size) + "-" + std::to_string(time));
  if (fs::exists(set / ".complete", ec)) return set;
  fs::create_directories(root);
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0 && e.path() != set) fs::remove_all(e.path(), ec);
  std::string tmp = (root / (".tmp-" + prefix + "XXXXXX")).string();
  if (::mkdtemp(tmp.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmp + " failed");
  o.out_dir = tmp;
  synthesize(o);
  std::ofstream(fs::path(tmp) / ".complete") << "synthesized\n";
  fs::rename(tmp, set, ec);
  if (ec) fs::remove_all(tmp, ec);  // another process renamed its copy first
  return set;
}

// The small captioning set.
inline const std::filesystem::path& synth_dir() {
  static const std::filesystem::path dir = shared_data_set("captions-", [] {
    SynthOptions o;
    o.train = 240;
    o.val = 48;
    o.seed = 3;
    o.min_side = 32;
    o.max_side = 96;
    return o;
  }());
  return dir;
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
