// Bad input to the data commands and the data paths of `dhp train`, tried on the real
// executable (DHP_BINARY): the exit status and the message, under a short timeout where the
// fault used to hang, so that a regression fails instead of blocking the suite.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>

#include "data/build.h"
#include "data/shard_format.h"
#include "tests/run_dhp.h"
#include "tests/train_fixture.h"
#include "trainer/config.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::Outcome;
using testing::read_text;
using testing::run_dhp;
using testing::run_dir;
using testing::small_config;
using testing::synth_dir;
using testing::write_text;

// Where a fault used to hang: long enough for a slow machine, short enough for a suite.
constexpr int kHangTimeout = 30;

std::string tokenizer() { return (synth_dir() / "tokenizer.model").string(); }

// `dhp train` of the small model for `steps` steps on `train`, no validation set.
std::string train_args(const fs::path& dir, const std::string& train, int steps,
                       const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"--data.train=" + train, "--data.val="};
  o.insert(o.end(), extra.begin(), extra.end());
  write_text(dir / "run.toml", to_toml(small_config(steps, dir, o)));
  return "train -c " + (dir / "run.toml").string();
}

std::string build_args(const std::string& manifest, const fs::path& out) {
  return "data build --manifest " + manifest + " --tokenizer " + tokenizer() + " --out " +
         out.string();
}

TEST(DataFaults, SynthRefusesAFolderThatIsNotEmpty) {
  const auto dir = run_dir("synth-over");
  fs::create_directories(dir / "set");
  write_text(dir / "set" / "train.jsonl", "mine\n");
  const Outcome r = run_dhp("data synth --out " + (dir / "set").string() + " --train 2 --val 1", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is not empty")) << r.output;
  EXPECT_TRUE(contains(r.output, "--force")) << r.output;
  EXPECT_EQ(read_text(dir / "set" / "train.jsonl"), "mine\n");
  // --force writes over it, as a request to regenerate.
  const Outcome f =
      run_dhp("data synth --out " + (dir / "set").string() + " --train 2 --val 1 --force", dir);
  EXPECT_EQ(f.status, 0) << f.output;
  EXPECT_NE(read_text(dir / "set" / "train.jsonl"), "mine\n");
  // A new or empty folder needs nothing.
  fs::create_directories(dir / "empty");
  EXPECT_EQ(run_dhp("data synth --out " + (dir / "empty").string() + " --train 2 --val 1", dir).status, 0);
}

TEST(DataFaults, BuildWorkersAndMaxShardsAreBounded) {
  const auto dir = run_dir("build-bounds");
  const std::string m = (synth_dir() / "val.jsonl").string();
  Outcome r = run_dhp(build_args(m, dir / "a") + " --workers 100000", dir, "", kHangTimeout);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--workers must be between 1 and 256")) << r.output;
  r = run_dhp(build_args(m, dir / "b") + " --workers 0", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--workers must be between 1 and 256")) << r.output;
  r = run_dhp(build_args(m, dir / "c") + " --max-shards -1", dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--max-shards must be >= 1")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "c" / kIndexFile));
  r = run_dhp(build_args(m, dir / "d") + " --max-shards 0", dir);
  EXPECT_EQ(r.status, 1) << r.output;
}

TEST(DataFaults, ABuildWithNoUsableSampleFails) {
  const auto dir = run_dir("build-none");
  write_text(dir / "bad.jsonl",
             "{\"id\":\"x\",\"image\":\"nope.png\",\"conversations\":[{\"from\":\"human\",\"value\":"
             "\"<image>hi\"},{\"from\":\"gpt\",\"value\":\"a\"}]}\n");
  const Outcome r = run_dhp(build_args((dir / "bad.jsonl").string(), dir / "out"), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "no usable sample (1 of 1 lines skipped: missing image")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out" / kIndexFile));
  EXPECT_TRUE(contains(read_text(dir / "out" / kReportFile), "missing image"));
}

TEST(DataFaults, AManifestThatIsNotARegularFileIsRefusedNotWaitedOn) {
  const auto dir = run_dir("manifest-fifo");
  ASSERT_EQ(::mkfifo((dir / "m.fifo").c_str(), 0644), 0);
  const std::string fifo = (dir / "m.fifo").string();
  for (const std::string& args :
       {train_args(dir, fifo, 2), build_args(fifo, dir / "out"), train_args(dir, "/dev/zero", 2)}) {
    const Outcome r = run_dhp(args, dir, "", kHangTimeout);
    EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "is not a regular file")) << r.output;
  }
}

TEST(DataFaults, AShardThatIsAFifoIsRefusedNotWaitedOn) {
  const auto dir = run_dir("shard-fifo");
  BuildOptions o;
  o.manifest = (synth_dir() / "train.jsonl").string();
  o.out_dir = (dir / "built").string();
  o.tokenizer = tokenizer();
  o.shard_bytes = 64 << 10;
  o.progress = false;
  build_dataset(o);
  ASSERT_TRUE(fs::exists(dir / "built" / shard_file_name(1)));
  for (int64_t k = 0; fs::exists(dir / "built" / shard_file_name(k)); ++k) {
    fs::remove(dir / "built" / shard_file_name(k));
    ASSERT_EQ(::mkfifo((dir / "built" / shard_file_name(k)).c_str(), 0644), 0);
  }
  const std::string built = (dir / "built").string();
  Outcome r = run_dhp(train_args(dir, built, 2, {"--data.on_error=fail"}), dir, "", kHangTimeout);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is not a regular file")) << r.output;
  // Skipped, every sample is a placeholder: a step with no usable sample, said at once.
  r = run_dhp(train_args(dir, built, 2, {"--data.on_error=skip"}), dir, "", kHangTimeout);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is not a regular file")) << r.output;
}

TEST(DataFaults, ADamagedIndexAndAFolderTokenizerAreNamed) {
  const auto dir = run_dir("damaged-index");
  BuildOptions o;
  o.manifest = (synth_dir() / "val.jsonl").string();
  o.out_dir = (dir / "built").string();
  o.tokenizer = tokenizer();
  o.progress = false;
  build_dataset(o);
  std::string bytes = read_text(dir / "built" / kIndexFile);
  for (size_t k = 2048; k < bytes.size(); k += 101) bytes[k] = char(bytes[k] ^ 0x5a);
  write_text(dir / "built" / kIndexFile, bytes);
  Outcome r = run_dhp("data stats --data " + (dir / "built").string(), dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "damaged")) << r.output;
  EXPECT_FALSE(contains(r.output, "not built by this version")) << r.output;
  fs::create_directories(dir / "tokdir");
  r = run_dhp(train_args(dir, (synth_dir() / "val.jsonl").string(), 2,
                         {"--data.tokenizer=" + (dir / "tokdir").string()}),
              dir);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a folder")) << r.output;
}

}  // namespace
}  // namespace dhp
