// Folders of the Hugging Face tests (test_hf, test_hf_llava, ...): made by the Python scripts of
// tests/reference/ (once per build, see fixture_command) and copied under a per-process
// temporary root that is removed when the binary's tests end.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/input.h"
#include "trainer/safetensors.h"

namespace dhp::testing {

inline const std::filesystem::path& hf_fixture_root() {
  static const std::filesystem::path r = [] {
    auto p = std::filesystem::temp_directory_path() /
             (std::string("dhp_") + program_invocation_short_name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p;
  }();
  return r;
}

class RemoveHfFixtures : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(hf_fixture_root(), ec);
  }
};
inline const auto* const kRemoveHfFixtures =
    ::testing::AddGlobalTestEnvironment(new RemoveHfFixtures);

// The command prefix that runs a script of tests/reference/ with Debian's PyTorch.
inline std::string reference_py() {
  return "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/";
}

// The command that makes the folder `out` with the fixture script tests/reference/`script` and its
// `args`, through tests/reference/cached_fixture.py: the script (PyTorch: about 1.8 s a process)
// runs once per build for the same arguments, in whichever test process asks first, and the
// others copy its folder.
inline std::string fixture_command(const std::string& script, const std::filesystem::path& out,
                                   const std::string& args) {
  return reference_py() + "cached_fixture.py " + DHP_FIXTURE_CACHE + " " + out.string() + " " + script + " " + args;
}

// hf_fixture_root()/name, made by `script` with `args` unless this process made it already.
inline std::filesystem::path hf_fixture(const std::string& script, const std::string& name,
                                        const std::string& args) {
  const auto dir = hf_fixture_root() / name;
  if (!std::filesystem::exists(dir / "config.json")) {
    const std::string cmd = fixture_command(script, dir, args);
    EXPECT_EQ(std::system(cmd.c_str()), 0)
        << cmd << ": needs Debian's python3-torch (scripts/setup.sh)";
  }
  return dir;
}

// Every floating-point tensor of one safetensors file as fp32, by name.
inline std::map<std::string, std::vector<float>> safetensors_f32(const std::filesystem::path& file) {
  const InputFile in("test file", file.string());
  const SafetensorsHeader h = read_safetensors_header(in, file.string());
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : h.tensors) {
    if (!is_float_dtype(t.dtype)) continue;
    std::vector<char> raw(size_t(t.end - t.begin));
    in.read_at(raw.data(), int64_t(raw.size()), h.data_start + t.begin);
    std::vector<float>& v = out[t.name];
    v.resize(size_t(t.numel()));
    widen_to_f32(v.data(), raw.data(), t.dtype, t.numel());
  }
  return out;
}

// The same over every .safetensors file of a folder (single file or shards).
inline std::map<std::string, std::vector<float>> folder_f32(const std::filesystem::path& dir) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") out.merge(safetensors_f32(e.path()));
  return out;
}

// The dtype and raw bytes of every tensor of a folder, by name: what "byte-identical" compares.
inline std::map<std::string, std::string> tensor_bytes(const std::filesystem::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    const InputFile in("test file", e.path().string());
    const SafetensorsHeader h = read_safetensors_header(in, e.path().string());
    for (const auto& t : h.tensors) {
      std::string raw(size_t(t.end - t.begin), '\0');
      in.read_at(raw.data(), int64_t(raw.size()), h.data_start + t.begin);
      out[t.name] = t.dtype + ":" + raw;
    }
  }
  return out;
}

}  // namespace dhp::testing
