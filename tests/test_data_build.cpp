// data/: `dhp data build` (shards, index, bad input, resume, determinism), ShardDataset
// (round trip against the JSONL path, range loading, damaged shards), stats and the synth
// presets, on fixtures generated here.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <nlohmann/json.hpp>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/rng.h"
#include "data/build.h"
#include "data/codecs.h"
#include "data/config.h"
#include "data/dataset.h"
#include "data/layout.h"
#include "data/loader.h"
#include "data/pack.h"
#include "data/presets.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"
#include "data/shard_io.h"
#include "data/stats.h"
#include "data/tokenizer.h"
#include "data/video.h"
#include "tests/data_fixture.h"

namespace dhp {
namespace {

BuildOptions options(const std::string& manifest, const fs::path& out, const std::string& tok) {
  BuildOptions o;
  o.manifest = manifest;
  o.out_dir = out.string();
  o.tokenizer = tok;
  o.workers = 2;
  o.shard_bytes = 40 << 10;  // several shards from the fixture's ~48 small images
  o.progress = false;
  return o;
}

// Every file of a folder, by name.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = read_text(e.path());
  return out;
}

class BuildTest : public DataTest {
 protected:
  // A straight build of the fixture, shared by the tests that only read it.
  static fs::path built() {
    const fs::path out = *root_ / "built";
    if (!fs::exists(out / kIndexFile)) build_dataset(options(manifest(), out, tokenizer()));
    return out;
  }
};

TEST_F(BuildTest, ShardsLoadExactlyLikeTheJsonlPath) {
  const fs::path out = built();
  EXPECT_GT(read_index(out.string()).n_shards(), 2);
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset direct(manifest(), "", tok, geometry, 4096, "fail");
  ShardDataset shards(out.string(), tok, geometry, 4096, "fail");
  ASSERT_EQ(shards.size(), direct.size());
  for (int64_t i = 0; i < shards.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "sample " << i);
    EXPECT_EQ(shards.name(i), direct.name(i));
    EXPECT_EQ(shards.length(i), direct.length(i));
    EXPECT_EQ(shards.vision_tokens(i), direct.vision_tokens(i));
    EXPECT_EQ(shards.loss_tokens(i), direct.loss_tokens(i));
    const Sample s = shards.load(i, false);
    expect_same(s, direct.load(i, false));
    // The length record equals what decoding actually produced.
    const ShardIndex& x = shards.index();
    const int64_t row = shards.index_row(i);
    const int64_t vision = std::count_if(s.image_of.begin(), s.image_of.end(), [](int32_t k) { return k >= 0; });
    EXPECT_EQ(x.at(row, kVision), vision);
    EXPECT_EQ(x.at(row, kText), int64_t(s.tokens.size()) - vision);
    EXPECT_EQ(x.at(row, kLoss), std::count(s.loss_mask.begin(), s.loss_mask.end(), 1));
  }
  // open_dataset tells the two apart by what the path is.
  DataConfig dc;
  dc.on_error = "fail";
  EXPECT_NE(dynamic_cast<ShardDataset*>(open_dataset(out.string(), dc, tok, geometry).get()), nullptr);
  EXPECT_NE(dynamic_cast<JsonlDataset*>(open_dataset(manifest(), dc, tok, geometry).get()), nullptr);
  EXPECT_THROW(open_dataset(dir().string(), dc, tok, geometry), Error);  // a folder without index
}

// InternVL's tiling through both data paths: each image becomes its tile grid and thumbnail,
// all between one <img> ... </img>; the length known from the headers is what loads; shards
// (which store each image once) load as the manifest; a batch holds one tower image a tile.
TEST_F(BuildTest, TiledImagesLoadAsTheirTilesOnBothPaths) {
  ImageGeometry g;
  g.resize = ImageFit::siglip;
  g.image_size = 56;  // 2 x 2 merged tokens a tile
  g.min_tiles = 1, g.max_tiles = 6, g.thumbnail = true;
  BuildOptions o = options(manifest(), *root_ / "built_tiled", tokenizer());
  o.vision = g;
  build_dataset(o);
  Tokenizer tok(tokenizer());
  ASSERT_TRUE(tok.ids().markers());
  JsonlDataset direct(manifest(), "", tok, g, 4096, "fail");
  ShardDataset shards((*root_ / "built_tiled").string(), tok, g, 4096, "fail");
  ASSERT_EQ(shards.size(), direct.size());
  int64_t multi = 0;
  for (int64_t i = 0; i < direct.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "sample " << i);
    const Sample s = direct.load(i, false);
    expect_same(shards.load(i, false), s);
    EXPECT_EQ(shards.length(i), direct.length(i));
    EXPECT_EQ(shards.images(i), direct.images(i));
    EXPECT_EQ(shards.tower_images(i), direct.tower_images(i));
    EXPECT_EQ(direct.images(i), int32_t(s.images.size()));  // the units a ring routes
    EXPECT_EQ(int64_t(s.tokens.size()), direct.length(i));
    int64_t tiles = 0;
    for (const PreparedImage& im : s.images) {
      EXPECT_EQ(im.grid_w, 4);
      EXPECT_EQ(im.grid_h, 4 * im.tiles);
      tiles += im.tiles;
      multi += im.tiles > 1;
    }
    EXPECT_EQ(tiles, direct.tower_images(i));
    EXPECT_EQ(std::count(s.tokens.begin(), s.tokens.end(), tok.ids().img_begin), int64_t(s.images.size()));
    EXPECT_EQ(std::count_if(s.image_of.begin(), s.image_of.end(), [](int32_t k) { return k >= 0; }), 4 * tiles);
    const Batch b = pack({&s}, g);
    EXPECT_EQ(int64_t(b.images.size()), tiles);
    for (const PackedImage& im : b.images) EXPECT_EQ(im.grid_h * im.grid_w, 16);
  }
  EXPECT_GT(multi, 5);
  // Untiled, the same manifest has one tower image an image.
  ImageGeometry one = g;
  one.max_tiles = 0;
  const JsonlDataset untiled(manifest(), "", tok, one, 4096, "fail");
  int64_t images = 0, tiles = 0;
  for (int64_t i = 0; i < direct.size(); ++i) images += untiled.tower_images(i), tiles += direct.tower_images(i);
  EXPECT_GT(tiles, images);
}

TEST_F(BuildTest, ShardRangeLoadEqualsSliceOfFullLoad) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  ShardDataset ds(built().string(), tok, geometry, 4096, "fail");
  Rng rng(5);
  for (int64_t i = 0; i < ds.size(); i += 2) {
    const Sample full = ds.load(i, false);
    const int64_t L = ds.length(i);
    for (int k = 0; k < 3; ++k) {
      int64_t a = rng.range(0, L), b = rng.range(0, L);
      if (a > b) std::swap(a, b);
      SCOPED_TRACE(::testing::Message() << "sample " << i << " [" << a << ", " << b << ")");
      expect_same(ds.load_range(i, a, b, k == 2), [&] {
        Sample s = slice_sample(full, a, b);
        if (k == 2) for (auto& im : s.images) blank(im);
        return s;
      }());
    }
  }
}

// What a ring group's routing needs without decoding: where each image's tokens lie. The
// shards and the manifest agree, the spans match the loaded image tokens, and a text-only
// load (another rank encodes the images) has the same tokens with no image decoded.
TEST_F(BuildTest, ImageSpansAndTextOnlyLoads) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  ShardDataset shards(built().string(), tok, geometry, 4096, "fail");
  JsonlDataset jsonl(manifest(), "", tok, geometry, 4096, "fail");
  ASSERT_EQ(shards.size(), jsonl.size());
  int64_t spans_seen = 0;
  for (int64_t i = 0; i < shards.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "sample " << i);
    const std::vector<ImageSpan> spans = shards.image_spans(i);
    const std::vector<ImageSpan> from_manifest = jsonl.image_spans(i);
    ASSERT_EQ(spans.size(), from_manifest.size());
    ASSERT_EQ(int64_t(spans.size()), shards.images(i));
    const Sample full = shards.load(i, false);
    for (size_t k = 0; k < spans.size(); ++k) {
      EXPECT_EQ(spans[k].first, from_manifest[k].first);
      EXPECT_EQ(spans[k].tokens, from_manifest[k].tokens);
      for (int64_t t = spans[k].first; t < spans[k].first + spans[k].tokens; ++t)
        ASSERT_EQ(full.image_of[size_t(t)], int32_t(k)) << "position " << t;
      EXPECT_EQ(full.image_of[size_t(spans[k].first - 1)], -1);  // <img> before it
      // The span's own range loads exactly that image.
      const Sample one = shards.load_range(i, spans[k].first, spans[k].first + spans[k].tokens, false);
      ASSERT_EQ(one.images.size(), 1u);
      EXPECT_EQ(one.first_image, int32_t(k));
      EXPECT_EQ(one.images[0].pixels, full.images[k].pixels);
      ++spans_seen;
    }
    const Sample text = shards.load_range(i, 0, shards.length(i), ImageLoad::Skip);
    EXPECT_TRUE(text.images_elsewhere);
    EXPECT_TRUE(text.images.empty());
    EXPECT_EQ(text.tokens, full.tokens);
    EXPECT_EQ(text.image_of, full.image_of);
  }
  EXPECT_GT(spans_seen, 0);
}

TEST_F(BuildTest, ResumedBuildEqualsStraightBuildByteForByte) {
  const fs::path straight = *root_ / "straight", resumed = *root_ / "resumed";
  BuildOptions a = options(manifest(), straight, tokenizer());
  a.workers = 1;
  const BuildSummary sa = build_dataset(a);
  ASSERT_TRUE(sa.complete);
  ASSERT_GE(sa.shards, 4);

  BuildOptions b = options(manifest(), resumed, tokenizer());
  b.workers = 2;
  b.max_new_shards = sa.shards / 2;  // "killed" half way
  const BuildSummary sb = build_dataset(b);
  EXPECT_FALSE(sb.complete);
  EXPECT_EQ(sb.shards, sa.shards / 2);
  EXPECT_FALSE(fs::exists(resumed / kIndexFile));
  Tokenizer tok(tokenizer());
  EXPECT_THROW(ShardDataset(resumed.string(), tok, ImageGeometry{}, 4096, "fail"), Error);
  // A kill in the middle of writing the next shard leaves a partial temporary file.
  write_text(resumed / (shard_file_name(sb.shards) + ".tmp"), "half a shard");
  b.max_new_shards = -1;
  const BuildSummary sc = build_dataset(b);
  EXPECT_TRUE(sc.complete);
  EXPECT_EQ(sc.resumed_shards, sa.shards / 2);
  EXPECT_LT(sc.processed_lines, sa.processed_lines);  // it continued, it did not start over
  EXPECT_EQ(sc.samples, sa.samples);
  const auto fa = files_of(straight), fb = files_of(resumed);
  ASSERT_EQ(fa.size(), fb.size());
  for (const auto& [name, bytes] : fa) {
    ASSERT_TRUE(fb.count(name)) << name;
    EXPECT_TRUE(fb.at(name) == bytes) << name << " differs";
  }
  // A rerun of a finished build changes nothing; other settings on the folder are refused.
  EXPECT_TRUE(build_dataset(b).complete);
  EXPECT_TRUE(files_of(resumed) == fb);
  b.max_tokens = 100;
  EXPECT_THROW(build_dataset(b), Error);
}

// A fixture with every kind of bad input, one per line, plus good lines.
struct BadSet {
  std::string manifest;
  std::map<std::string, int64_t> want;
  std::map<int64_t, std::string> lines;  // line -> reason
};

BadSet make_bad_set(const fs::path& d, const fs::path& synth) {
  fs::create_directories(d / "images");
  const std::string png = read_text(synth / "images" / "train-000000.png");
  std::string jpg;
  for (const auto& e : fs::directory_iterator(synth / "images"))
    if (e.path().extension() == ".jpg" && jpg.empty()) jpg = read_text(e.path());
  write_text(d / "images" / "ok.png", png);
  write_text(d / "images" / "garbage.png", "\x89PNG garbage bytes");
  write_text(d / "images" / "cut.png", png.substr(0, png.size() / 2));
  write_text(d / "images" / "cut.jpg", jpg.substr(0, jpg.size() * 6 / 10));
  codecs::write_image((d / "images" / "huge.png").string(), cv::Mat(300, 300, CV_8UC3, cv::Scalar(200, 200, 200)));
  const std::string img = ", \"image\": \"images/ok.png\"";
  std::string long_answer;
  for (int i = 0; i < 400; ++i) long_answer += "a red circle ";
  BadSet s;
  std::string m;
  auto add = [&](const std::string& text, const std::string& reason) {
    const int64_t line = std::count(m.begin(), m.end(), '\n') + 1;
    m += text;
    if (!reason.empty()) ++s.want[reason], s.lines[line] = reason;
  };
  add(line_json("good", img, "<image>\\nDescribe the image.", "a red circle."), "");
  add("{\"id\": \"broken\", \"image\": \n", "invalid json");
  add(line_json("utf8", img, "<image> \xff\xfe", "a red circle."), "bad utf-8");
  add(line_json("nofile", ", \"image\": \"images/nope.png\"", "<image>", "a circle."), "missing image");
  add(line_json("escape", ", \"image\": \"../../images/ok.png\"", "<image>", "a circle."), "bad image path");
  add(line_json("garbage", ", \"image\": \"images/garbage.png\"", "<image>", "a circle."), "unreadable image");
  add(line_json("cutpng", ", \"image\": \"images/cut.png\"", "<image>", "a circle."), "corrupt image");
  add(line_json("cutjpg", ", \"image\": \"images/cut.jpg\"", "<image>", "a circle."), "corrupt image");
  add(line_json("empty", img, "<image>", "   "), "empty text");
  add(line_json("huge", ", \"image\": \"images/huge.png\"", "<image>", "a circle."), "image too large");
  add(line_json("long", img, "<image>", long_answer), "too long");
  add(line_json("mismatch", img, "Describe the image.", "a red circle."), "image count mismatch");
  add("{\"id\": \"noconv\"}\n", "bad format");
  add("\n", "");
  add(line_json("two", ", \"images\": [\"images/ok.png\", \"images/ok.png\"]", "<image> and <image>", "two circles."), "");
  add("{\"id\": \"cut\", \"conversations\": [{\"from\": \"hu", "invalid json");  // no newline
  s.manifest = (d / "bad.jsonl").string();
  write_text(s.manifest, m);
  return s;
}

TEST_F(BuildTest, EveryBadInputIsCountedAndReported) {
  const fs::path d = *root_ / "badset";
  const BadSet bad = make_bad_set(d, dir());
  BuildOptions o = options(bad.manifest, d / "out", tokenizer());
  o.max_image_pixels = 250 * 250;
  o.max_tokens = 400;
  const BuildSummary s = build_dataset(o);
  ASSERT_TRUE(s.complete);
  EXPECT_EQ(s.samples, 2);
  EXPECT_EQ(s.skipped, bad.want);
  // The report lists every skipped line with its reason.
  const std::string report = read_text(d / "out" / kReportFile);
  for (const auto& [line, reason] : bad.lines)
    EXPECT_NE(report.find("\n" + std::to_string(line) + "\t" + reason + "\t"), std::string::npos)
        << line << " " << reason << "\n" << report;
  EXPECT_EQ(read_index((d / "out").string()).skipped.size(), bad.lines.size());
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  ShardDataset ds((d / "out").string(), tok, geometry, 400, "fail", 250 * 250);
  EXPECT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.name(0), "good");
  EXPECT_EQ(ds.name(1), "two");
  EXPECT_EQ(ds.load(1, false).images.size(), 2u);
  EXPECT_EQ(ds.skipped(), bad.want);

  // "fail" stops at the first bad line, naming it.
  o.out_dir = (d / "out-fail").string();
  o.on_error = "fail";
  try {
    build_dataset(o);
    ADD_FAILURE() << "fail mode should throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(bad.manifest + ":2: invalid json"), std::string::npos) << e.what();
  }
  // The JSONL path rejects exactly the same lines, cut files included (it decodes every
  // image when it opens the manifest), so no sample it keeps turns into a placeholder later.
  JsonlDataset jl(bad.manifest, "", tok, geometry, 400, "skip", 250 * 250);
  EXPECT_EQ(jl.skipped(), bad.want);
  ASSERT_EQ(jl.size(), 2);
  for (int64_t i = 0; i < jl.size(); ++i) {
    const Sample x = jl.load(i, false);
    EXPECT_EQ(int64_t(x.tokens.size()), jl.length(i));
    EXPECT_FALSE(x.skipped);
  }
  EXPECT_EQ(jl.bad_loads(), 0);
}

TEST_F(BuildTest, DamagedShardSkipsOrFailsNeverCrashes) {
  const fs::path out = *root_ / "damaged";
  fs::create_directories(out.parent_path());
  build_dataset(options(manifest(), out, tokenizer()));
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  const ShardIndex x = read_index(out.string());
  // Zero the bytes of the first image of sample 3 inside its shard.
  const int64_t victim = 3, k = x.at(victim, kImageBegin), shard = x.shard[victim];
  const int64_t off = x.extents[size_t(shard * kExtentCols + kBytesOffset)] + x.image(k, kByteBegin);
  const fs::path file = out / shard_file_name(shard);
  std::string bytes = read_text(file);
  std::fill(bytes.begin() + off, bytes.begin() + off + (x.image(k, kByteEnd) - x.image(k, kByteBegin)), '\0');
  write_text(file, bytes);

  ShardDataset skip(out.string(), tok, geometry, 4096, "skip");
  {
    LogCapture cap;
    for (int workers : {0, 2}) {
      BatchLoader loader(skip, workers);
      loader.submit({2, 3, 4}, false);
      const auto got = loader.next();
      ASSERT_EQ(got.size(), 3u);
      EXPECT_FALSE(got[0].skipped);
      EXPECT_TRUE(got[1].skipped);
      EXPECT_EQ(int64_t(got[1].tokens.size()), skip.length(3));  // the plan stays valid
      EXPECT_EQ(std::count(got[1].loss_mask.begin(), got[1].loss_mask.end(), 1), 0);
      EXPECT_FALSE(got[2].skipped);
    }
    EXPECT_NE(cap.text().find("checksum"), std::string::npos) << cap.text();
  }
  EXPECT_EQ(skip.bad_loads(), 2);
  ShardDataset fail(out.string(), tok, geometry, 4096, "fail");
  EXPECT_THROW(fail.load(3, false), Error);
  // A ring member that holds sample 3's text but not its image never decodes the damaged
  // blob; where the image lies is still known from the intact text.
  EXPECT_FALSE(fail.load_range(3, 0, fail.length(3), ImageLoad::Skip).skipped);
  EXPECT_EQ(int64_t(fail.image_spans(3).size()), fail.images(3));
  // Text of another sample in a truncated shard: also an error, not a crash.
  fs::resize_file(file, fs::file_size(file) / 2);
  int64_t other = 0;
  while (x.shard[size_t(other)] != shard || other == victim || x.at(other, kImageEnd) == x.at(other, kImageBegin))
    ++other;
  EXPECT_THROW(fail.load(other, false), Error);
  EXPECT_TRUE(skip.load(other, false).skipped);
  // Its image positions are unreadable too: none in skip mode (so every rank of a ring
  // expects none, as its placeholder holds none), an error in fail mode.
  const int64_t bad_before = skip.bad_loads();
  EXPECT_THROW(fail.image_spans(other), Error);
  EXPECT_TRUE(skip.image_spans(other).empty());
  EXPECT_EQ(skip.bad_loads(), bad_before + 1);
}

TEST_F(BuildTest, OtherTokenizerIsRefused) {
  const fs::path other = *root_ / "other.model";
  train_tokenizer({"some other words entirely", "and a few more"}, 64, other.string());
  Tokenizer tok(other.string());
  EXPECT_THROW(ShardDataset(built().string(), tok, ImageGeometry{}, 4096, "fail"), Error);
}

TEST(Stats, PercentilesAndHistogram) {
  std::vector<int64_t> v(100);
  for (int i = 0; i < 100; ++i) v[size_t(i)] = i + 1;
  const Distribution d = describe(v);
  EXPECT_EQ(d.n, 100);
  EXPECT_EQ(d.min, 1);
  EXPECT_EQ(d.p50, 50);
  EXPECT_EQ(d.p90, 90);
  EXPECT_EQ(d.p99, 99);
  EXPECT_EQ(d.p999, 100);
  EXPECT_EQ(d.max, 100);
  EXPECT_DOUBLE_EQ(d.mean, 50.5);
  // Power-of-two bins: 1, 2-3, 4-7, ..., 64-127 (37 values: 64..100).
  const std::string h = histogram(v, 10);
  EXPECT_TRUE(std::regex_search(h, std::regex("\\n +64\\.\\.127 +37 +60\\.1% +#{10}\\n"))) << h;
  EXPECT_TRUE(std::regex_search(h, std::regex("\\n +1\\.\\.1 +1 +0\\.0% +#\\n"))) << h;
  EXPECT_EQ(std::count(h.begin(), h.end(), '\n'), 1 + 7);  // header and bins 1 .. 64-127
}

TEST_F(DataTest, PresetSynthFollowsThePresetAndIsDeterministic) {
  SynthOptions o;
  o.preset = "mixed";
  o.train = 40;
  o.val = 4;
  o.scale = 0.15;
  o.out_dir = (*root_ / "preset-a").string();
  synthesize(o);
  o.out_dir = (*root_ / "preset-b").string();
  synthesize(o);
  EXPECT_TRUE(files_of(*root_ / "preset-a") == files_of(*root_ / "preset-b"));
  const PresetParams p = preset_params("mixed");
  std::ifstream in(*root_ / "preset-a" / "train.jsonl");
  std::string line;
  int64_t i = 0, multi = 0, text_only = 0, clips = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    size_t n = j.contains("images") ? j["images"].size() : j.contains("image") ? 1 : 0;
    // A video sample's frames are a clip of one second per frame at 4 frames per second.
    if (j.contains("video")) {
      const VideoReader v((*root_ / "preset-a" / j["video"].get<std::string>()).string(), "");
      n = size_t(v.info().frames / 4);
      ++clips;
    }
    EXPECT_EQ(n, preset_sample(p, (int64_t(1) << 40) + i, o.seed, o.factor).images.size()) << i;
    multi += n > 1 && !j.contains("video");
    text_only += n == 0;
    ++i;
  }
  EXPECT_EQ(i, 40);
  EXPECT_GT(multi, 0);
  EXPECT_GT(text_only, 0);
  EXPECT_GT(clips, 0);
}


TEST_F(BuildTest, DamagedIndexReferencesAreRefusedNotFollowed) {
  const fs::path copy = *root_ / "damaged-index";
  fs::remove_all(copy);
  fs::copy(built(), copy);
  const std::string index = (copy / kIndexFile).string();
  {
    // Point sample 0 at a shard that does not exist.
    hid_t f = H5Fopen(index.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t d = H5Dopen2(f, "shard", H5P_DEFAULT);
    ASSERT_GE(d, 0);
    std::vector<int32_t> shard(size_t(read_index(built().string()).size()));
    ASSERT_GE(H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, shard.data()), 0);
    shard[0] = 1000;
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, shard.data()), 0);
    H5Dclose(d);
    H5Fclose(f);
    // Sealed again, as a faulty build would have written it: the bounds checks must hold
    // without the seal's help.
    seal_file(index);
  }
  try {
    read_index(copy.string());
    ADD_FAILURE() << "a damaged index was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the index tables"), std::string::npos) << e.what();
  }
}

// An index written under the previous format (lengths from the resize rule without its final
// clamp) must be refused with a message that says to rebuild, never read with stale lengths.
TEST_F(BuildTest, IndexOfAnOlderFormatIsRefusedWithRebuildAdvice) {
  const fs::path copy = *root_ / "old-format";
  fs::remove_all(copy);
  fs::copy(built(), copy);
  const std::string index = (copy / kIndexFile).string();
  {
    hid_t f = H5Fopen(index.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    hid_t a = H5Aopen(f, "version", H5P_DEFAULT);
    ASSERT_GE(a, 0);
    const int64_t old_version = kShardFormatVersion - 1;
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &old_version), 0);
    H5Aclose(a);
    H5Fclose(f);
    seal_file(index);
  }
  try {
    read_index(copy.string());
    ADD_FAILURE() << "an index of an older format was read";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fmt::format("format version {}", kShardFormatVersion - 1)), std::string::npos) << what;
    EXPECT_NE(what.find("rebuild"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(read_index(built().string()));
}

}  // namespace
}  // namespace dhp
