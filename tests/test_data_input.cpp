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
#include "data/shard_io.h"
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
  write_text(d / "ds" / "m.jsonl",
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
  const std::string good = read_text(manifest()).substr(0, read_text(manifest()).find('\n') + 1);
  write_text(d / "m.jsonl", good + std::string(size_t(kMaxLineBytes) + 1, 'x') + "\n");
  Tokenizer tok(tokenizer());
  const std::string msg = error_of([&] {
    JsonlDataset((d / "m.jsonl").string(), dir().string(), tok, ImageGeometry{}, 4096, "skip");
  });
  EXPECT_TRUE(contains(msg, "line 2 longer than")) << msg;
  // A line of exactly the cap, and a last line without its newline, are lines like any other.
  write_text(d / "cap.txt", "ab\n" + std::string(100, 'y') + "\nlast");
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

// Damage patterns over a whole file: from each start, every `stride`-th byte flipped.
// Together they hit the seal, the superblock, object headers, attributes and table bytes.
template <class F>
void for_each_damage(const fs::path& file, F check) {
  const std::string clean = read_text(file);
  for (size_t start = 0; start < clean.size(); start += 89)
    for (size_t stride : {size_t(61), size_t(997), clean.size()}) {
      std::string bytes = clean;
      for (size_t k = start; k < bytes.size(); k += stride) bytes[k] = char(bytes[k] ^ 0x5a);
      write_text(file, bytes);
      SCOPED_TRACE(::testing::Message() << "bytes flipped from " << start << " every " << stride);
      check();
    }
  write_text(file, clean);
}

// HDF5 1.10 crashes on some damaged object headers and reads damaged tables as plausible
// numbers: every damaged index must be refused as damaged before HDF5 parses it, never
// crash, allocate a damaged length, or be called a file of another version.
TEST_F(InputTest, ADamagedIndexIsReportedAsDamaged) {
  const fs::path out = fresh("damaged-index") / "built";
  build_dataset(build_options(out));
  const fs::path index = out / kIndexFile;
  const ShardIndex clean = read_index(out.string());
  int refused = 0, unchanged = 0;
  for_each_damage(index, [&] {
    const std::string msg = error_of([&] {
      const ShardIndex x = read_index(out.string());
      // Only the seal's zero padding may be hit without consequence.
      EXPECT_TRUE(x.samples == clean.samples && x.images == clean.images &&
                  x.names == clean.names && x.extents == clean.extents && x.shard == clean.shard);
    });
    ++(msg.empty() ? unchanged : refused);
    if (msg.empty()) return;
    EXPECT_TRUE(contains(msg, index.string())) << msg;
    EXPECT_TRUE(contains(msg, "damaged")) << msg;
    EXPECT_FALSE(contains(msg, "not built by this version")) << msg;
  });
  EXPECT_GT(refused, 100);
  EXPECT_LT(unchanged, refused / 10);
  EXPECT_NO_THROW(read_index(out.string()));
}

// A shard's tables are read when a build resumes: damaged metadata is HDF5's checksum error,
// damaged table bytes are the shard's; either way it is damage, never different numbers.
TEST_F(InputTest, ADamagedShardsTablesAreReportedAsDamaged) {
  const fs::path out = fresh("damaged-shard") / "built";
  build_dataset(build_options(out));
  const fs::path shard = out / shard_file_name(0);
  const ShardContents clean = read_shard_tables(shard.string(), nullptr);
  int refused = 0;
  for_each_damage(shard, [&] {
    const std::string msg = error_of([&] {
      const ShardContents x = read_shard_tables(shard.string(), nullptr);
      // Damage to texts and images is found by their own checksums when a sample loads.
      EXPECT_TRUE(x.samples == clean.samples && x.images == clean.images &&
                  x.names == clean.names && x.name_offsets == clean.name_offsets &&
                  x.first_line == clean.first_line && x.end_line == clean.end_line);
    });
    if (msg.empty()) return;
    ++refused;
    EXPECT_TRUE(contains(msg, shard.string())) << msg;
    EXPECT_TRUE(contains(msg, "damaged")) << msg;
  });
  EXPECT_GT(refused, 100);
}

// A file written before seals existed is read as it is; a sealed one is checked.
TEST_F(InputTest, SealedFilesAreCheckedAndUnsealedOnesStillRead) {
  const fs::path d = fresh("seal");
  for (const Seal seal : {Seal::none, Seal::whole_file}) {
    const std::string path = (d / (seal == Seal::none ? "plain.h5" : "sealed.h5")).string();
    {
      H5Writer w(path, seal);
      w.attr("answer", int64_t(42));
      w.i64("table", {1, 2, 3, 4, 5, 6}, 2);
      w.close();
    }
    EXPECT_EQ(read_text(path).substr(0, 8), seal == Seal::none ? "\x89HDF\r\n\x1a\n" : "dhp-seal");
    {
      H5Reader r(path);
      EXPECT_EQ(r.attr_i64("answer"), 42);
      EXPECT_EQ(r.i64("table", 2), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
    }
    if (seal == Seal::none) continue;
    std::string bytes = read_text(path);
    bytes.back() = char(bytes.back() ^ 1);
    write_text(path, bytes);
    const std::string msg = error_of([&] { H5Reader r(path); });
    EXPECT_TRUE(contains(msg, "is damaged")) << msg;
    EXPECT_TRUE(contains(msg, "checksum")) << msg;
  }
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
