// data/: packing (whole samples and pieces), the sampler and the background loader.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/layout.h"
#include "data/loader.h"
#include "data/pack.h"
#include "data/sampler.h"
#include "data/synth.h"
#include "data/tokenizer.h"

#include "tests/data_fixture.h"

namespace dhp {
namespace {

// ---- pack ----------------------------------------------------------------------------------

// Pixels tag, tag + 1, ... (mod 256): each image's start is recognisable in the pack.
PreparedImage fake_image(int gh, int gw, const ImageGeometry& v, int tag) {
  PreparedImage im;
  im.grid_h = gh;
  im.grid_w = gw;
  im.pixels.resize(size_t(im.n_patches() * v.patch_numel()));
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = uint8_t((tag + int(i)) % 256);
  return im;
}

TEST(Pack, TwoSamplesWithImages) {
  ImageGeometry v;
  v.patch = 2;  // 12 values per patch keeps the hand-built arrays short
  v.merge = 2;
  Sample a;  // two images: 2 x 4 patches (2 merged tokens) then 2 x 2 (1 merged token)
  a.id = 5;
  a.tokens = {2, 4, 0, 0, 5, 4, 0, 5, 10, 11, 3};
  a.loss_mask = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  a.image_of = {-1, -1, 0, 0, -1, -1, 1, -1, -1, -1, -1};
  a.images = {fake_image(2, 4, v, 10), fake_image(2, 2, v, 20)};
  Sample b;  // text, one 2 x 2 image, answer
  b.id = 9;
  b.tokens = {2, 20, 4, 0, 5, 21, 3};
  b.loss_mask = {0, 0, 0, 0, 0, 1, 1};
  b.image_of = {-1, -1, -1, 0, -1, -1, -1};
  b.images = {fake_image(2, 2, v, 30)};

  const Batch bt = pack({&a, &b}, v);
  EXPECT_EQ(bt.T, 18);
  std::vector<int32_t> tokens = a.tokens;
  tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
  EXPECT_EQ(bt.tokens, tokens);
  const std::vector<int32_t> targets = {-1, -1, -1, -1, -1, -1, -1, -1, 11, 3, -1,
                                        -1, -1, -1, -1, 21, 3, -1};
  EXPECT_EQ(bt.targets, targets);
  const std::vector<int32_t> doc = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(bt.doc, doc);
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(bt.pos, pos);
  const std::vector<int32_t> slot = {-1, -1, 0, 1, -1, -1, 2, -1, -1, -1, -1,
                                     -1, -1, -1, 3, -1, -1, -1};
  EXPECT_EQ(bt.image_slot, slot);
  EXPECT_EQ(bt.loss_tokens(), 4);
  EXPECT_EQ(bt.sample_ids, (std::vector<int64_t>{5, 9}));
  ASSERT_EQ(bt.images.size(), 3u);
  EXPECT_EQ(bt.images[0].patch_offset, 0);
  EXPECT_EQ(bt.images[1].patch_offset, 8);
  EXPECT_EQ(bt.images[2].patch_offset, 12);
  EXPECT_EQ(bt.images[1].grid_h, 2);
  EXPECT_EQ(bt.images[0].grid_w, 4);
  EXPECT_EQ(bt.n_patches(), 16);
  ASSERT_EQ(int64_t(bt.pixels.size()), 16 * v.patch_numel());
  EXPECT_EQ(bt.pixels[0], 10);
  EXPECT_EQ(bt.pixels[size_t(8 * v.patch_numel())], 20);
  EXPECT_EQ(bt.pixels[size_t(12 * v.patch_numel() + 5)], 35);
}

// ---- sampler -------------------------------------------------------------------------------

TEST(Sampler, DeterministicCoveringAndStraddling) {
  const int64_t n = 37, bs = 5;
  Sampler s(n, 42), same(n, 42), other(n, 43);
  EXPECT_EQ(s.batch(3, bs), same.batch(3, bs));
  EXPECT_NE(s.batch(3, bs), other.batch(3, bs));
  EXPECT_NE(s.permutation(0), s.permutation(1));
  // The stream of the first three epochs, batch by batch.
  std::vector<int64_t> stream;
  for (int64_t step = 0; int64_t(stream.size()) < 3 * n; ++step) {
    const auto b = s.batch(step, bs);
    ASSERT_EQ(int64_t(b.size()), bs);
    stream.insert(stream.end(), b.begin(), b.end());
  }
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int64_t> epoch(stream.begin() + e * n, stream.begin() + (e + 1) * n);
    EXPECT_EQ(epoch, s.permutation(e));
    std::sort(epoch.begin(), epoch.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(epoch[size_t(i)], i) << "epoch " << e;
  }
  // Step 7 covers stream positions 35..39: the last two of epoch 0, the first three of 1.
  const auto straddle = s.batch(7, bs);
  const auto p0 = s.permutation(0), p1 = s.permutation(1);
  EXPECT_EQ(straddle, (std::vector<int64_t>{p0[35], p0[36], p1[0], p1[1], p1[2]}));
  // A batch larger than the data set spans several epochs.
  Sampler tiny(3, 1);
  const auto big = tiny.batch(0, 8);
  std::vector<int64_t> want = tiny.permutation(0);
  for (int64_t e : {1, 2}) {
    const auto p = tiny.permutation(e);
    want.insert(want.end(), p.begin(), p.end());
  }
  want.resize(8);
  EXPECT_EQ(big, want);
}

// ---- loader --------------------------------------------------------------------------------


TEST_F(DataTest, LoaderMatchesLoadInOrder) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset ds(manifest(), "", tok, geometry, 4096, "fail");
  const std::vector<std::vector<int64_t>> subs = {{5, 1, 7, 3, 3, 0}, {40, 2}, {}, {11, 12, 13}};
  for (int workers : {0, 1, 2}) {
    BatchLoader loader(ds, workers, 3);
    loader.submit(subs[0], false);
    loader.submit(subs[1], true);
    loader.submit(subs[2], false);
    for (size_t k = 0; k < subs.size(); ++k) {
      const auto got = loader.next();
      if (k + 3 < subs.size()) loader.submit(subs[k + 3], false);
      ASSERT_EQ(got.size(), subs[k].size()) << "workers " << workers;
      for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], ds.load(subs[k][i], k == 1));
      EXPECT_GE(loader.last_wait_seconds(), 0.0);
    }
    EXPECT_EQ(loader.pending(), 0);
  }
  {
    BatchLoader loader(ds, 2, 2);  // destroyed with work queued: must join, not hang
    std::vector<int64_t> all(size_t(ds.size()));
    std::iota(all.begin(), all.end(), int64_t(0));
    loader.submit(all, false);
    loader.submit(all, true);
  }
}

TEST_F(DataTest, LoaderSurfacesWorkerErrors) {
  const fs::path d = *root_ / "vanishing";
  fs::create_directories(d / "images");
  fs::copy_file(dir() / "images" / "train-000000.png", d / "images" / "a.png",
                fs::copy_options::overwrite_existing);
  write_text(d / "m.jsonl",
             line_json("a", ", \"image\": \"images/a.png\"", "<image>", "a red circle."));
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset ds((d / "m.jsonl").string(), "", tok, geometry, 4096, "fail");
  fs::remove(d / "images" / "a.png");  // gone after indexing: decoding must fail
  for (int workers : {0, 2}) {
    BatchLoader loader(ds, workers);
    loader.submit({0, 0}, false);
    EXPECT_THROW(loader.next(), Error) << "workers " << workers;
  }
}

// ---- sampler state -------------------------------------------------------------------------

TEST(Sampler, StateResumesTheExactSequence) {
  const int64_t n = 37;
  const Sampler s(n, 99);
  // The stream a run with batch size 5 sees over 30 steps (several epochs).
  std::vector<int64_t> stream;
  for (int64_t step = 0; step < 30; ++step) {
    const auto b = s.batch(step, 5);
    stream.insert(stream.end(), b.begin(), b.end());
  }
  for (int64_t e = 0; e * n + n <= int64_t(stream.size()); ++e) {  // each epoch: a permutation
    std::vector<int64_t> ep(stream.begin() + e * n, stream.begin() + (e + 1) * n);
    std::sort(ep.begin(), ep.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ep[size_t(i)], i) << "epoch " << e;
  }
  // Save after step 11 (a few integers), resume in a fresh sampler: the same continuation,
  // with the same batch size and with another one.
  const SamplerState st = s.state_at(12 * 5);
  EXPECT_EQ(st.seed, 99u);
  EXPECT_EQ(st.epoch, 60 / n);
  EXPECT_EQ(st.position, 60 % n);
  const Sampler fresh(n, 99);
  int64_t pos = fresh.resume(st);
  for (int64_t step = 12; step < 30; ++step, pos += 5)
    EXPECT_EQ(fresh.batch_at(pos, 5), s.batch(step, 5)) << "step " << step;
  pos = fresh.resume(st);
  for (int64_t at = 60; at + 7 <= int64_t(stream.size()); at += 7, pos += 7)
    EXPECT_EQ(fresh.batch_at(pos, 7),
              std::vector<int64_t>(stream.begin() + at, stream.begin() + at + 7));
  EXPECT_THROW(Sampler(n, 98).resume(st), Error);
  EXPECT_THROW(Sampler(n - 30, 99).resume(st), Error);  // the data set shrank under it
}

// ---- pieces --------------------------------------------------------------------------------

// Cut points inside text and inside images, including the edges of the sample.
std::vector<int64_t> cuts_for(const Sample& s, uint64_t seed) {
  const int64_t L = int64_t(s.tokens.size());
  std::vector<int64_t> cuts = {0, L};
  Rng rng(seed);
  for (int k = 0; k < 3; ++k) cuts.push_back(rng.range(0, L));
  for (int64_t t = 1; t < L; ++t)  // just inside the first image, if any
    if (s.image_of[size_t(t)] >= 0 && s.image_of[size_t(t - 1)] < 0) {
      cuts.push_back(t + 1);
      break;
    }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

TEST_F(DataTest, RangeLoadEqualsSliceOfFullLoad) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset ds(manifest(), "", tok, geometry, 4096, "fail");
  for (int64_t i = 0; i < ds.size(); i += 3) {
    const Sample full = ds.load(i, false);
    const auto cuts = cuts_for(full, uint64_t(i));
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      SCOPED_TRACE(::testing::Message() << "sample " << i << " [" << cuts[c] << ", " << cuts[c + 1] << ")");
      const Sample piece = ds.load_range(i, cuts[c], cuts[c + 1], false);
      expect_same(piece, slice_sample(full, cuts[c], cuts[c + 1]));
      int64_t image_tokens = 0;
      for (int32_t k : piece.image_of) image_tokens += k >= 0;
      // Only images whose tokens the range holds are decoded.
      EXPECT_EQ(piece.images.empty(), image_tokens == 0);
    }
  }
  EXPECT_THROW(ds.load_range(0, 0, ds.length(0) + 1, false), Error);
}

TEST_F(DataTest, PackedPiecesEqualSlicesOfThePackedSample) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset ds(manifest(), "", tok, geometry, 4096, "fail");
  const ImageGeometry& v = geometry;
  const int64_t m2 = int64_t(v.merge) * v.merge;
  for (int64_t i : {0, 5, 17}) {
    const Sample full = ds.load(i, false);
    const Batch whole = pack({&full}, v);
    const auto cuts = cuts_for(full, 7 + uint64_t(i));
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int64_t a = cuts[c], b = cuts[c + 1];
      const Sample piece = ds.load_range(i, a, b, false);
      const Batch pb = pack({&piece}, v);
      int64_t slot_base = 0;  // merged tokens of the full sample's images before the piece's
      for (int32_t k = 0; k < piece.first_image; ++k) slot_base += full.images[size_t(k)].n_patches() / m2;
      for (int64_t t = a; t < b; ++t) {
        SCOPED_TRACE(::testing::Message() << "sample " << i << " token " << t);
        const size_t p = size_t(t - a);
        ASSERT_EQ(pb.tokens[p], whole.tokens[size_t(t)]);
        ASSERT_EQ(pb.targets[p], whole.targets[size_t(t)]);
        ASSERT_EQ(pb.pos[p], whole.pos[size_t(t)]);
        for (size_t a3 = 0; a3 < 3; ++a3) ASSERT_EQ(pb.rope_pos[3 * p + a3], whole.rope_pos[size_t(3 * t) + a3]);
        ASSERT_EQ(pb.image_slot[p] < 0 ? -1 : pb.image_slot[p] + slot_base, whole.image_slot[size_t(t)]);
      }
    }
  }
}

// M-RoPE positions (Sample::rope_pos) are Hugging Face's: Qwen3VLModel.get_rope_index written
// out in PyTorch (tests/reference/rope_index_ref.py) over whole samples with several images of
// several shapes, framed by the vision-start marker; a range loaded without its images (another
// rank encodes them) has the same positions as one loaded with them. Negative control: the
// positions differ from 1-D ones wherever an image stands.
TEST_F(DataTest, MRopePositionsAreTransformersRopeIndex) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset ds(manifest(), "", tok, geometry, 4096, "fail");
  const SpecialIds ids = tok.ids();
  ASSERT_TRUE(ids.markers());
  // Four of the data set's samples with an image, and documents laid out here with several
  // images of several shapes (wide, tall, one token, two in a row, one first), their images
  // not decoded: the positions come from the stored sizes alone.
  std::vector<Sample> samples;
  std::vector<std::vector<MergedGrid>> grids;
  for (int64_t i = 0; i < ds.size() && samples.size() < 4; ++i) {
    Sample s = ds.load(i, false);
    if (s.images.empty()) continue;
    grids.emplace_back();
    for (const auto& im : s.images) grids.back().push_back({im.grid_h / geometry.merge, im.grid_w / geometry.merge});
    samples.push_back(std::move(s));
  }
  const std::vector<std::pair<std::vector<int32_t>, std::vector<MergedGrid>>> made = {
      {{7, 8, -1, 9, -2, 10, 11, -3, 12}, {{2, 3}, {4, 1}, {1, 1}}},
      {{-1, -2, 7, 8, 9}, {{3, 3}, {1, 5}}},
      {{7, -1, 8, -2, -3, 9}, {{5, 2}, {2, 2}, {1, 4}}}};
  for (const auto& [layout, g] : made) {
    const std::vector<uint8_t> loss(layout.size(), 1);
    StoredLayout st{layout.data(), loss.data(), int64_t(layout.size()), g, ids};
    Sample s = expand_layout(st, 0, full_length(st), nullptr, geometry.merge, ImageLoad::Skip);
    grids.push_back(g);
    samples.push_back(std::move(s));
  }
  nlohmann::json cases = nlohmann::json::array();
  for (size_t n = 0; n < samples.size(); ++n) {
    nlohmann::json c = {{"ids", samples[n].tokens}, {"vision_start", ids.img_begin}, {"image_token", ids.image_token()},
                        {"merge", geometry.merge}, {"grids", nlohmann::json::array()}};
    for (const MergedGrid& g : grids[n]) c["grids"].push_back({1, g.rows * geometry.merge, g.cols * geometry.merge});
    cases.push_back(c);
  }
  const fs::path dir = fs::temp_directory_path() / ("dhp_rope_index_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "cases.json") << cases.dump();
  const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/rope_index_ref.py " +
                          (dir / "cases.json").string() + " " + (dir / "out.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " failed: it needs Debian's python3-torch (scripts/setup.sh)";
  const nlohmann::json want = nlohmann::json::parse(std::ifstream(dir / "out.json"));
  fs::remove_all(dir);
  for (size_t n = 0; n < samples.size(); ++n) {
    const Sample& full = samples[n];
    const int64_t L = int64_t(full.tokens.size());
    ASSERT_EQ(int64_t(full.rope_pos.size()), 3 * L);
    bool differs_from_1d = false;
    for (int64_t t = 0; t < L; ++t)
      for (int a = 0; a < 3; ++a) {
        ASSERT_EQ(full.rope_pos[size_t(3 * t + a)], want[n][size_t(a)][size_t(t)].get<int32_t>())
            << "sample " << full.id << " token " << t << " axis " << a;
        differs_from_1d |= full.rope_pos[size_t(3 * t + a)] != t;
      }
    EXPECT_TRUE(differs_from_1d) << "sample " << full.id;
    // Ranges, with and without their images.
    if (n >= 4) continue;
    const auto cuts = cuts_for(full, uint64_t(full.id));
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const Sample skipped = ds.load_range(full.id, cuts[k], cuts[k + 1], ImageLoad::Skip);
      EXPECT_EQ(skipped.rope_pos, slice_sample(full, cuts[k], cuts[k + 1]).rope_pos) << "sample " << full.id;
    }
  }
}

TEST_F(DataTest, LoaderServesPieces) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset ds(manifest(), "", tok, geometry, 4096, "fail");
  const std::vector<Piece> pieces = {
      {3, 0, 5}, {3, 5, -1}, {9, 2, std::min<int64_t>(40, ds.length(9))}, {0, 0, -1}};
  for (int workers : {0, 2}) {
    BatchLoader loader(ds, workers);
    loader.submit(pieces, false);
    const auto got = loader.next();
    ASSERT_EQ(got.size(), pieces.size());
    for (size_t k = 0; k < pieces.size(); ++k) {
      const int64_t end = pieces[k].end < 0 ? ds.length(pieces[k].sample) : pieces[k].end;
      expect_same(got[k], ds.load_range(pieces[k].sample, pieces[k].begin, end, false));
    }
  }
}

}  // namespace
}  // namespace dhp
