// data/ and core/input: input files that are not what they claim to be. A FIFO, a device or
// a folder where a manifest, shard, index or tokenizer should be is an error naming it, never
// a wait; an image swapped for a symlink out of its root is refused at load time; a manifest
// line has a length cap; loading a manifest stops when the stop flag is raised.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>

#include "core/input.h"
#include "data/build.h"
#include "data/dataset.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"
#include "data/tokenizer.h"
#include "tests/data_fixture.h"
#include "tests/error_of.h"

namespace dhp {
namespace {

using testing::error_of;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The message `f` throws. `f` must not block on the FIFO `fifo`: after 10 s a writer opens
// and closes the FIFO, once a second, so that each blocked open returns, and the test fails
// instead of hanging.
template <class F>
std::string error_without_blocking(const fs::path& fifo, F f) {
  auto done = std::async(std::launch::async, [&] { return error_of(f); });
  if (done.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return done.get();
  ADD_FAILURE() << "blocked on the FIFO '" << fifo.string() << "'";
  do {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  } while (done.wait_for(std::chrono::seconds(1)) != std::future_status::ready);
  return done.get();
}

class InputTest : public DataTest {
 protected:
  static fs::path fresh(const std::string& name) {
    const fs::path d = *root_ / name;
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }
  static BuildOptions build_options(const fs::path& out) {
    BuildOptions o;
    o.manifest = manifest();
    o.out_dir = out.string();
    o.tokenizer = tokenizer();
    o.shard_bytes = 40 << 10;  // several shards from the fixture's small images
    o.progress = false;
    return o;
  }
};

const std::string kLine = line_json("a", ", \"image\": \"images/a.png\"", "<image>", "a circle.");

TEST_F(InputTest, AnImageSwappedForASymlinkOutOfTheRootIsRefusedAtLoad) {
  const fs::path d = fresh("swap");
  fs::create_directories(d / "ds" / "images");
  fs::create_directories(d / "outside");
  const fs::path image = dir() / "images" / "train-000000.png";
  fs::copy_file(image, d / "ds" / "images" / "a.png");
  fs::copy_file(image, d / "ds" / "images" / "real.png");
  // Same size as the images it replaces, so no size check can notice the swap.
  fs::copy_file(image, d / "outside" / "secret.png");
  // A symlink inside the root that stays inside is fine, at open and at load.
  fs::create_symlink("real.png", d / "ds" / "images" / "b.png");
  write_file(d / "ds" / "m.jsonl",
             kLine + line_json("b", ", \"image\": \"images/b.png\"", "<image>", "a square."));
  Tokenizer tok(tokenizer());
  const std::string m = (d / "ds" / "m.jsonl").string();
  JsonlDataset fail(m, "", tok, ImageGeometry{}, 4096, "fail");
  JsonlDataset skip(m, "", tok, ImageGeometry{}, 4096, "skip");
  ASSERT_EQ(fail.size(), 2);
  EXPECT_FALSE(fail.load(0, false).skipped);
  EXPECT_FALSE(fail.load(1, false).skipped);
  // Swapped mid-run for a link out of the root.
  fs::remove(d / "ds" / "images" / "a.png");
  fs::create_symlink("../../outside/secret.png", d / "ds" / "images" / "a.png");
  const std::string msg = error_of([&] { fail.load(0, false); });
  EXPECT_TRUE(contains(msg, "outside")) << msg;
  EXPECT_TRUE(skip.load(0, false).skipped);
  // The target of an inside link swapped for an absolute link out: the same.
  fs::remove(d / "ds" / "images" / "real.png");
  fs::create_symlink(d / "outside" / "secret.png", d / "ds" / "images" / "real.png");
  EXPECT_TRUE(contains(error_of([&] { fail.load(1, false); }), "outside"));
  EXPECT_TRUE(skip.load(1, false).skipped);
}

TEST_F(InputTest, AManifestThatIsAFifoIsRefusedNotWaitedOn) {
  const fs::path d = fresh("fifo-manifest");
  ASSERT_EQ(::mkfifo((d / "m.jsonl").c_str(), 0644), 0);
  Tokenizer tok(tokenizer());
  std::string msg = error_without_blocking(d / "m.jsonl", [&] {
    JsonlDataset((d / "m.jsonl").string(), dir().string(), tok, ImageGeometry{}, 4096, "skip");
  });
  EXPECT_TRUE(contains(msg, "is not a regular file")) << msg;
  BuildOptions o = build_options(d / "out");
  o.manifest = (d / "m.jsonl").string();
  msg = error_without_blocking(d / "m.jsonl", [&] { build_dataset(o); });
  EXPECT_TRUE(contains(msg, "is not a regular file")) << msg;
  // A device would never end.
  msg = error_of([&] { JsonlDataset("/dev/zero", dir().string(), tok, ImageGeometry{}, 4096, "skip"); });
  EXPECT_TRUE(contains(msg, "is not a regular file")) << msg;
}

TEST_F(InputTest, AManifestLineHasALengthCap) {
  const fs::path d = fresh("long-line");
  // One real line, then a line one byte over the cap: the cap is reported with its line.
  const std::string good = read_file(manifest()).substr(0, read_file(manifest()).find('\n') + 1);
  write_file(d / "m.jsonl", good + std::string(size_t(kMaxLineBytes) + 1, 'x') + "\n");
  Tokenizer tok(tokenizer());
  const std::string msg = error_of([&] {
    JsonlDataset((d / "m.jsonl").string(), dir().string(), tok, ImageGeometry{}, 4096, "skip");
  });
  EXPECT_TRUE(contains(msg, "line 2 longer than")) << msg;
  // A line of exactly the cap, and a last line without its newline, are lines like any other.
  write_file(d / "cap.txt", "ab\n" + std::string(100, 'y') + "\nlast");
  LineReader r("file", (d / "cap.txt").string(), "", nullptr, 100);
  std::string line;
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line, "ab");
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line.size(), 100u);
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line, "last");
  EXPECT_FALSE(r.next(line));
  EXPECT_EQ(r.line_no(), 3);
}

TEST_F(InputTest, LoadingAManifestStopsWhenTheStopFlagIsRaised) {
  Tokenizer tok(tokenizer());
  const int stop = 1;
  const std::string msg = error_of([&] {
    JsonlDataset(manifest(), "", tok, ImageGeometry{}, 4096, "skip", kDefaultMaxImagePixels,
                 false, &stop);
  });
  EXPECT_TRUE(contains(msg, "stopped by a signal")) << msg;
  EXPECT_TRUE(contains(msg, manifest())) << msg;
}

TEST_F(InputTest, AShardOrIndexThatIsNotARegularFileIsRefusedNotWaitedOn) {
  const fs::path out = fresh("shards") / "built";
  build_dataset(build_options(out));
  Tokenizer tok(tokenizer());
  ShardDataset skip(out.string(), tok, ImageGeometry{}, 4096, "skip");
  ShardDataset fail(out.string(), tok, ImageGeometry{}, 4096, "fail");
  const ShardIndex x = read_index(out.string());
  int64_t victim = 0;
  while (x.shard[size_t(victim)] != 1) ++victim;
  const fs::path shard = out / shard_file_name(1);
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0644), 0);
  std::string msg = error_without_blocking(shard, [&] { fail.load(victim, false); });
  EXPECT_TRUE(contains(msg, "is not a regular file")) << msg;
  bool skipped = false;
  error_without_blocking(shard, [&] { skipped = skip.load(victim, false).skipped; });
  EXPECT_TRUE(skipped);
  // A folder in its place is named as such, not as a file of 4096 bytes.
  fs::remove(shard);
  fs::create_directory(shard);
  msg = error_of([&] { fail.load(victim, false); });
  EXPECT_TRUE(contains(msg, "is a folder")) << msg;
  // The index, which HDF5 opens.
  const fs::path index = out / kIndexFile;
  fs::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0644), 0);
  msg = error_without_blocking(index, [&] { read_index(out.string()); });
  EXPECT_TRUE(contains(msg, "is not a regular file")) << msg;
}

TEST_F(InputTest, ADamagedIndexIsReportedAsDamaged) {
  const fs::path out = fresh("damaged-index") / "built";
  build_dataset(build_options(out));
  const fs::path index = out / kIndexFile;
  std::string bytes = read_file(index);
  for (size_t k = 2048; k < bytes.size(); k += 101) bytes[k] = char(bytes[k] ^ 0x5a);
  write_file(index, bytes);
  const std::string msg = error_of([&] { read_index(out.string()); });
  EXPECT_TRUE(contains(msg, "damaged")) << msg;
  EXPECT_TRUE(contains(msg, "HDF5")) << msg;
  EXPECT_FALSE(contains(msg, "not built by this version")) << msg;
}

TEST_F(InputTest, ATokenizerThatIsAFolderOrAFifoIsNamedAsSuch) {
  const fs::path d = fresh("tokenizer");
  std::string msg = error_of([&] { Tokenizer t(d.string()); });
  EXPECT_TRUE(contains(msg, "is a folder")) << msg;
  ASSERT_EQ(::mkfifo((d / "tok.model").c_str(), 0644), 0);
  msg = error_without_blocking(d / "tok.model", [&] { Tokenizer t((d / "tok.model").string()); });
  EXPECT_TRUE(contains(msg, "is not a regular file")) << msg;
  msg = error_of([&] { Tokenizer t((d / "none.model").string()); });
  EXPECT_TRUE(contains(msg, "not found")) << msg;
}

TEST(Input, PrintableEscapesControlBytesAndBrokenUtf8) {
  EXPECT_EQ(printable("a/b c.png"), "a/b c.png");
  EXPECT_EQ(printable("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(printable(std::string("x\0y\n\x1b[2J\xff", 9)), "x\\x00y\\x0a\\x1b[2J\\xff");
}

}  // namespace
}  // namespace dhp
