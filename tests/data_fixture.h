// Shared by the data test executables: one small synthesized data set per executable and a
// few helpers.
#pragma once

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/check.h"
#include "data/dataset.h"
#include "data/synth.h"
#include "tests/file_text.h"

namespace dhp {

namespace fs = std::filesystem;

using testing::read_text;
using testing::write_text;

// One small synthesized data set shared by the tests of an executable.
class DataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() /
                         (std::string("dhp_") + program_invocation_short_name + "_" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    SynthOptions o;
    o.out_dir = (*root_ / "synth").string();
    o.train = 48;
    o.val = 8;
    o.seed = 11;
    synthesize(o);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  static fs::path dir() { return *root_ / "synth"; }
  static std::string manifest() { return (dir() / "train.jsonl").string(); }
  static std::string tokenizer() { return (dir() / "tokenizer.model").string(); }
  static inline fs::path* root_ = nullptr;
};

class LogCapture {
 public:
  LogCapture() : old_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out_);
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink));
  }
  ~LogCapture() { spdlog::set_default_logger(old_); }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::logger> old_;
};

inline std::string line_json(const std::string& id, const std::string& images,
                      const std::string& human, const std::string& gpt) {
  return "{\"id\": \"" + id + "\"" + images +
         ", \"conversations\": [{\"from\": \"human\", \"value\": \"" + human +
         "\"}, {\"from\": \"gpt\", \"value\": \"" + gpt + "\"}]}\n";
}

inline void expect_same(const Sample& a, const Sample& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.loss_mask, b.loss_mask);
  EXPECT_EQ(a.image_of, b.image_of);
  EXPECT_EQ(a.rope_pos, b.rope_pos);
  EXPECT_EQ(a.begin, b.begin);
  EXPECT_EQ(a.full_length, b.full_length);
  EXPECT_EQ(a.first_image, b.first_image);
  EXPECT_EQ(a.first_image_token, b.first_image_token);
  EXPECT_EQ(a.next_target, b.next_target);
  EXPECT_EQ(a.skipped, b.skipped);
  ASSERT_EQ(a.images.size(), b.images.size());
  for (size_t k = 0; k < a.images.size(); ++k) {
    EXPECT_EQ(a.images[k].grid_h, b.images[k].grid_h);
    EXPECT_EQ(a.images[k].grid_w, b.images[k].grid_w);
    EXPECT_EQ(a.images[k].frames, b.images[k].frames);
    EXPECT_EQ(a.images[k].pixels, b.images[k].pixels);
  }
}

}  // namespace dhp
