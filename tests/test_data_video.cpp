// data/video.h end to end on clips written here with OpenCV's VideoWriter: the sampling rule,
// the per-video pixel budget, decoding through the JSONL path and the build (which must
// agree token for token and pixel for pixel), seeking against decoding forward, every bad
// video skipped with its reason by both paths, and `dhp data synth --preset video-longtail`
// through build, stats and a few training steps.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "data/build.h"
#include "data/chat_template.h"
#include "data/codecs.h"
#include "data/config.h"
#include "data/dataset.h"
#include "data/layout.h"
#include "data/presets.h"
#include "data/shard_dataset.h"
#include "data/shard_format.h"
#include "data/tokenizer.h"
#include "data/video.h"
#include "tests/data_fixture.h"
#include "tests/error_of.h"
#include "tests/run_dhp.h"

namespace dhp {
namespace {

// Frame i of a test clip is one flat colour whose blue channel is kStep * i, so a decoded
// frame tells which frame it is (MJPEG keeps flat areas within a few levels; the value wraps
// every 64 frames).
constexpr int kStep = 4;

int fourcc_of(const std::string& name) {
  return codecs::fourcc(name[0], name[1], name[2], name[3]);
}

void write_clip(const fs::path& path, int frames, double fps, int h, int w,
                const std::string& fourcc = "MJPG") {
  codecs::VideoWriter out(path.string(), cv::CAP_FFMPEG, fourcc_of(fourcc), fps, cv::Size(w, h));
  ASSERT_TRUE(out.opened()) << path << " " << fourcc;
  for (int i = 0; i < frames; ++i)
    out.write(cv::Mat(h, w, CV_8UC3, cv::Scalar((kStep * i) % 256, 128, 255 - (kStep * i) % 256)));
}

// Which test-clip frame a decoded image shows (RGB patch layout: blue is channel 2).
int frame_shown(const PreparedImage& im) {
  return int(std::lround(double(im.pixels[2]) / kStep));
}

std::string video_line(const std::string& id, const std::string& media, const std::string& human,
                       const std::string& answer = "a red circle on the left.") {
  return line_json(id, media, human, answer);
}

class VideoTest : public DataTest {
 protected:
  void SetUp() override {
    dir_ = *root_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }
  // A JsonlDataset over `lines` written to dir_/name.
  std::string manifest_of(const std::string& name, const std::string& lines) {
    const fs::path p = dir_ / name;
    write_text(p, lines);
    return p.string();
  }
  // Options that build `manifest` into dir_/built with the fixture's tokenizer, quietly.
  BuildOptions build_options(const std::string& manifest) {
    BuildOptions o;
    o.manifest = manifest;
    o.out_dir = (dir_ / "built").string();
    o.tokenizer = tokenizer();
    o.progress = false;
    return o;
  }
  fs::path dir_;
  ImageGeometry geometry_;  // patch 14, merge 2: f = 28
};

TEST(VideoSampling, FramesFollowRateDurationAndLimits) {
  VideoRules r;  // 1 fps, from 4 frames
  r.max_frames = 64;
  // 10 s at 10 fps: ten frames at the centres of ten 1-s slices.
  EXPECT_EQ(sample_frames(100, 10, r), (std::vector<int64_t>{5, 15, 25, 35, 45, 55, 65, 75, 85, 95}));
  // 2 s: two by the rate, lifted to min_frames.
  EXPECT_EQ(sample_frames(20, 10, r), (std::vector<int64_t>{2, 7, 12, 17}));
  // 100 s at 30 fps: capped at max_frames, spread over the whole clip.
  const auto capped = sample_frames(3000, 30, r);
  ASSERT_EQ(capped.size(), 64u);
  EXPECT_EQ(capped.front(), 23);
  EXPECT_EQ(capped.back(), 2976);
  EXPECT_TRUE(std::is_sorted(capped.begin(), capped.end()));
  EXPECT_EQ(std::adjacent_find(capped.begin(), capped.end()), capped.end());
  // Fewer frames than min_frames: every frame, once.
  EXPECT_EQ(sample_frames(3, 25, r), (std::vector<int64_t>{0, 1, 2}));
  // Another rate: 2 fps over 6 s.
  r.fps = 2;
  r.max_frames = 100;
  EXPECT_EQ(sample_frames(60, 10, r).size(), 12u);
  EXPECT_EQ(sample_frames(60, 10, r)[0], 2);
  r.fps = 0.25;  // one frame per 4 s of a 40-s clip
  EXPECT_EQ(sample_frames(400, 10, r), (std::vector<int64_t>{20, 60, 100, 140, 180, 220, 260,
                                                             300, 340, 380}));
  EXPECT_THROW(sample_frames(0, 10, r), Error);
}

TEST(VideoSampling, PixelBudgetShrinksLongClipsAndKeepsTheResizeRule) {
  ImageGeometry v;  // f = 28, 256..65536 pixels
  VideoRules r;
  r.max_pixels = 400000;
  const ImageSize src{480, 640};
  // One frame: the budget exceeds max_pixels, so the image rule alone decides.
  const ImageSize one = frame_size(src, 1, v, r);
  EXPECT_EQ(one.h, resized_size(480, 640, v).h);
  EXPECT_EQ(one.w, resized_size(480, 640, v).w);
  int64_t last = int64_t(one.h) * one.w;
  for (int64_t n : {2, 4, 8, 16, 32, 64, 128}) {
    SCOPED_TRACE(n);
    const ImageSize s = frame_size(src, n, v, r);
    const int64_t area = int64_t(s.h) * s.w;
    EXPECT_EQ(s.h % 28, 0);
    EXPECT_EQ(s.w % 28, 0);
    EXPECT_LE(area, std::max<int64_t>(r.max_pixels / n, 28 * 28));  // within the budget
    EXPECT_LE(area, last);                                           // longer: never larger
    last = area;
    // A fixed point of the plain rule: stored at this size, a frame counts these tokens.
    const ImageSize again = resized_size(s.h, s.w, v);
    EXPECT_EQ(again.h, s.h);
    EXPECT_EQ(again.w, s.w);
  }
  EXPECT_LT(last, int64_t(one.h) * one.w / 8);
  // min_pixels above f^2 (configs/longtail.toml: f = 16, 1024..16384): the budget's floors
  // can fall below min_pixels; the stored size is still a fixed point.
  ImageGeometry lt;
  lt.patch = 8, lt.merge = 2, lt.min_pixels = 1024, lt.max_pixels = 16384;
  for (int64_t n : {1, 3, 50, 500})
    for (ImageSize in : {ImageSize{70, 70}, ImageSize{90, 40}, ImageSize{33, 300}}) {
      const ImageSize s = frame_size(in, n, lt, r);
      const ImageSize again = resized_size(s.h, s.w, lt);
      EXPECT_TRUE(again.h == s.h && again.w == s.w) << n << " " << in.h << "x" << in.w;
      EXPECT_GE(int64_t(s.h) * s.w, lt.min_pixels);
    }
  // pad_square: a frame is padded and resized as an image is, from its own size, whatever
  // the budget.
  ImageGeometry pad = lt;
  pad.resize = ImageFit::pad_square;
  pad.image_size = 64;
  const ImageSize kept = frame_size(src, 32, pad, r);
  EXPECT_EQ(kept.h, src.h);
  EXPECT_EQ(kept.w, src.w);
  EXPECT_EQ(resized_size(kept.h, kept.w, pad).h, 64);
}

TEST_F(VideoTest, ContainerProbeAndSeekingAgreeWithDecodingForward) {
  // avc1: H.264 through libx264, which Debian's FFmpeg carries.
  for (const std::string codec : {"MJPG", "mp4v", "avc1"}) {
    SCOPED_TRACE(codec);
    const fs::path clip = dir_ / (codec == "MJPG" ? "c.avi" : "c-" + codec + ".mp4");
    write_clip(clip, 150, 12, 48, 64, codec);
    VideoReader seek(clip.string(), "");
    EXPECT_EQ(seek.info().frames, 150);
    EXPECT_DOUBLE_EQ(seek.info().fps, 12);
    EXPECT_EQ(seek.info().size.h, 48);
    EXPECT_EQ(seek.info().size.w, 64);
    VideoReader forward(clip.string(), "", /*seek=*/false);
    // Near targets are decoded to, far ones (and going back) sought.
    for (int64_t f : {3, 20, 21, 100, 149, 5, 60}) {
      const cv::Mat a = seek.frame(f), b = forward.frame(f);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(cv::norm(a, b, cv::NORM_INF), 0) << f;  // the very same frame
      // MPEG-4's prediction drifts on flat colours more than MJPEG's per-frame coding.
      EXPECT_NEAR(a.at<cv::Vec3b>(10, 10)[0], (kStep * f) % 256, codec == "MJPG" ? 3 : 8) << f;
    }
    EXPECT_GT(seek.seeks(), 0);
    EXPECT_LT(seek.decoded(), forward.decoded());  // seeking skipped frames
    EXPECT_EQ(forward.seeks(), 0);
  }
}

TEST_F(VideoTest, ManifestVideoBecomesTimestampedFramesInMarkerOrder) {
  write_clip(dir_ / "clip.avi", 60, 10, 96, 128);  // 6 s: six frames at 1 fps
  const cv::Mat img(56, 84, CV_8UC3, cv::Scalar(0, 0, 255));
  ASSERT_TRUE(codecs::write_image((dir_ / "a.png").string(), img));
  const std::string m = manifest_of(
      "m.jsonl",
      video_line("v1", ", \"image\": \"a.png\", \"video\": \"clip.avi\"",
                 "Compare <image> with <video> please.") +
          video_line("v2", ", \"videos\": [\"clip.avi\", \"clip.avi\"]", "<video> then <video>"));
  Tokenizer tok(tokenizer());
  JsonlDataset ds(m, "", tok, geometry_, 4096, "fail");
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(VideoRules{}.max_frames, 768);  // the defaults below: 1 fps, 4 .. 768 frames
  EXPECT_EQ(ds.images(0), 1 + 6);
  EXPECT_EQ(ds.images(1), 12);
  const std::vector<int64_t> want = sample_frames(60, 10, VideoRules{});
  ASSERT_EQ(want, (std::vector<int64_t>{5, 15, 25, 35, 45, 55}));
  const ImageSize fs_ = frame_size({96, 128}, 6, geometry_, VideoRules{});
  for (int64_t i = 0; i < 2; ++i) {
    const Sample s = ds.load(i, false);
    EXPECT_EQ(int64_t(s.tokens.size()), ds.length(i));  // the length index is the loaded length
    const int64_t vision =
        std::count_if(s.image_of.begin(), s.image_of.end(), [](int32_t k) { return k >= 0; });
    EXPECT_EQ(vision, ds.vision_tokens(i));
    // The image comes first in sample 0 (its marker does), then the frames in time order.
    const size_t first_frame = i == 0 ? 1 : 0;
    if (i == 0) {
      EXPECT_EQ(s.images[0].pixels[0], 255);  // the red image, R first
    }
    for (size_t k = first_frame; k < s.images.size(); ++k) {
      const PreparedImage& im = s.images[k];
      EXPECT_EQ(im.grid_h * 14, fs_.h);
      EXPECT_EQ(im.grid_w * 14, fs_.w);
      EXPECT_NEAR(frame_shown(im), want[(k - first_frame) % 6], 0) << k;
    }
    // Each frame's block follows its timestamp text: "<t>s" tokens, then <img>.
    const std::vector<ImageSpan> spans = ds.image_spans(i);
    for (size_t k = first_frame; k < spans.size(); ++k) {
      const std::vector<int32_t> stamp = tok.encode(frame_timestamp(double(want[(k - first_frame) % 6]) / 10));
      const int64_t img_at = spans[k].first - 1;
      ASSERT_GE(img_at, int64_t(stamp.size()));
      EXPECT_EQ(s.tokens[size_t(img_at)], tok.ids().img_begin);
      EXPECT_TRUE(std::equal(stamp.begin(), stamp.end(), s.tokens.begin() + img_at - int64_t(stamp.size())))
          << "frame " << k;
    }
  }
  // A ring piece over the middle of sample 1 decodes only its frames and equals the slice.
  const Sample full = ds.load(1, false);
  const std::vector<ImageSpan> spans = ds.image_spans(1);
  const int64_t a = spans[4].first + 1, b = spans[8].first + 2;
  const Sample piece = ds.load_range(1, a, b, ImageLoad::Decode);
  expect_same(piece, slice_sample(full, a, b));
  EXPECT_EQ(piece.images.size(), 5u);
}

// A tower that embeds frame pairs (Qwen3-VL): each pair one image of two frames after its
// "<t seconds>" (the mean of the pair's times), an odd count's last frame paired with itself;
// the pixels of the second frame after the first's; a ring piece equal to the full sample's
// slice; built shards that give the same.
TEST_F(VideoTest, FramePairsForATemporalTower) {
  write_clip(dir_ / "clip.avi", 50, 10, 96, 128);  // 5 s: five frames at 1 fps
  const std::string m = manifest_of("m.jsonl", video_line("v", ", \"video\": \"clip.avi\"", "What happens? <video>"));
  Tokenizer tok(tokenizer());
  ImageGeometry pairs = geometry_;
  pairs.video_frames_per_image = 2;
  JsonlDataset ds(m, "", tok, pairs, 4096, "fail");
  ASSERT_EQ(ds.size(), 1);
  const std::vector<int64_t> want = sample_frames(50, 10, VideoRules{});
  ASSERT_EQ(want, (std::vector<int64_t>{5, 15, 25, 35, 45}));
  EXPECT_EQ(ds.images(0), 3);  // (5, 15), (25, 35), (45, 45)
  const Sample s = ds.load(0, false);
  EXPECT_EQ(int64_t(s.tokens.size()), ds.length(0));
  ASSERT_EQ(s.images.size(), 3u);
  const std::vector<ImageSpan> spans = ds.image_spans(0);
  for (size_t k = 0; k < 3; ++k) {
    const PreparedImage& im = s.images[k];
    ASSERT_EQ(im.frames, 2);
    const int64_t half = int64_t(im.pixels.size()) / 2;
    PreparedImage first = im, second = im;
    first.pixels.resize(size_t(half));
    second.pixels.assign(im.pixels.begin() + half, im.pixels.end());
    const int64_t f0 = want[2 * k], f1 = want[std::min<size_t>(2 * k + 1, 4)];
    EXPECT_NEAR(frame_shown(first), f0, 0) << k;
    EXPECT_NEAR(frame_shown(second), f1, 0) << k;
    const std::vector<int32_t> stamp = tok.encode(frame_pair_timestamp(double(f0 + f1) / 2 / 10));
    const int64_t img_at = spans[k].first - 1;
    EXPECT_EQ(s.tokens[size_t(img_at)], tok.ids().img_begin);
    EXPECT_TRUE(std::equal(stamp.begin(), stamp.end(), s.tokens.begin() + img_at - int64_t(stamp.size()))) << k;
  }
  EXPECT_EQ(frame_pair_timestamp(1.0), "<1.0 seconds>");
  const int64_t a = spans[1].first + 1, b = spans[2].first + 2;
  expect_same(ds.load_range(0, a, b, ImageLoad::Decode), slice_sample(s, a, b));
  // Built, each pair is one stored picture: the shards give the JSONL path's sample. A run of
  // one frame an image is refused the build (its videos are laid out for the other).
  BuildOptions o = build_options(m);
  o.vision = pairs;
  o.on_error = "fail";
  ASSERT_TRUE(build_dataset(o).complete);
  ShardDataset shards(o.out_dir, tok, pairs, 4096, "fail");
  expect_same(shards.load(0, false), s);
  const std::string msg = testing::error_of([&] { ShardDataset(o.out_dir, tok, geometry_, 4096, "fail"); });
  EXPECT_NE(msg.find("takes 2 video frames an image, this run's takes 1"), std::string::npos) << msg;
}

// A tiled tower (InternVL's) takes a video's frames as one tile each, "Frame{i}: " before
// and "\n" after each, as InternVL's chat code lays them out; images are tiled, two of a sample
// sharing the tiles (InternVL's fine-tuning: max(1, max_tiles / images) each); a sample holds
// images or a video, not both. Built, each frame is stored as its tile and the shards give the
// JSONL path's samples.
TEST_F(VideoTest, FramesOfATiledTowerAreOneTileEach) {
  write_clip(dir_ / "clip.avi", 30, 10, 96, 128);  // 3 s: min_frames = 4
  const cv::Mat img(40, 120, CV_8UC3, cv::Scalar(40, 200, 90));  // wide: 3 x 1 tiles and the thumbnail
  ASSERT_TRUE(codecs::write_image((dir_ / "wide.png").string(), img));
  const std::string m = manifest_of(
      "m.jsonl", video_line("v", ", \"video\": \"clip.avi\"", "<video> What happens?") +
                     video_line("one", ", \"image\": \"wide.png\"", "<image> What is it?") +
                     video_line("two", ", \"images\": [\"wide.png\", \"wide.png\"]", "<image> and <image>?") +
                     video_line("mix", ", \"image\": \"wide.png\", \"video\": \"clip.avi\"", "<image> <video>"));
  Tokenizer tok(tokenizer());
  ImageGeometry tiled = geometry_;
  tiled.image_size = 56, tiled.max_tiles = 4, tiled.resize = ImageFit::siglip;
  const std::string mixed = testing::error_of([&] { JsonlDataset(m, "", tok, tiled, 4096, "fail"); });
  EXPECT_NE(mixed.find("images and a video in one sample for a tiled tower"), std::string::npos) << mixed;
  JsonlDataset ds(m, "", tok, tiled, 4096, "skip");
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.tower_images(1), 4);      // 3 x 1 and the thumbnail
  EXPECT_EQ(ds.tower_images(2), 2 * 3);  // each of two: up to 2 tiles (2 x 1) and the thumbnail
  EXPECT_EQ(ds.load(2, false).images[1].tiles, 3);
  const std::vector<int64_t> want = sample_frames(30, 10, VideoRules{});
  const size_t n = want.size();
  EXPECT_EQ(ds.images(0), int32_t(n));
  EXPECT_EQ(ds.tower_images(0), int32_t(n));  // one tile a frame
  const Sample s = ds.load(0, false);
  EXPECT_EQ(int64_t(s.tokens.size()), ds.length(0));
  ASSERT_EQ(s.images.size(), n);
  const std::vector<ImageSpan> spans = ds.image_spans(0);
  const std::vector<int32_t> newline = tok.encode("\n");
  for (size_t k = 0; k < n; ++k) {
    const PreparedImage& im = s.images[k];
    EXPECT_EQ(im.tiles, 1);
    EXPECT_EQ(im.grid_h, 4);
    EXPECT_EQ(im.grid_w, 4);
    EXPECT_NEAR(frame_shown(im), want[k], 0) << k;
    const std::vector<int32_t> label = tok.encode(frame_label(k));
    const int64_t img_at = spans[k].first - 1, end_at = spans[k].first + spans[k].tokens;
    EXPECT_EQ(s.tokens[size_t(img_at)], tok.ids().img_begin);
    EXPECT_TRUE(std::equal(label.begin(), label.end(), s.tokens.begin() + img_at - int64_t(label.size()))) << k;
    EXPECT_EQ(s.tokens[size_t(end_at)], tok.ids().img_end);
    EXPECT_TRUE(std::equal(newline.begin(), newline.end(), s.tokens.begin() + end_at + 1)) << k;
  }
  EXPECT_EQ(frame_label(0), "Frame1: ");
  BuildOptions o = build_options(m);
  o.vision = tiled;
  o.on_error = "skip";
  ASSERT_TRUE(build_dataset(o).complete);
  ShardDataset shards(o.out_dir, tok, tiled, 4096, "fail");
  ASSERT_EQ(shards.size(), ds.size());
  for (int64_t i = 0; i < ds.size(); ++i) {
    EXPECT_EQ(shards.length(i), ds.length(i));
    EXPECT_EQ(shards.images(i), ds.images(i));
    EXPECT_EQ(shards.tower_images(i), ds.tower_images(i));
    expect_same(shards.load(i, false), ds.load(i, false));
  }
  // Built for the tiled tower, refused by an untiled run (its videos are laid out apart).
  const std::string other = testing::error_of([&] { ShardDataset(o.out_dir, tok, geometry_, 4096, "fail"); });
  EXPECT_NE(other.find("was built for a tower that tiles images"), std::string::npos) << other;
}

TEST_F(VideoTest, BuiltShardsEqualTheJsonlPathAndHoldDecodedFrames) {
  write_clip(dir_ / "long.avi", 240, 8, 120, 160);     // 30 s -> 30 frames, budget-limited
  write_clip(dir_ / "short.mp4", 20, 10, 64, 64, "mp4v");  // 2 s -> min_frames = 4
  const cv::Mat img(70, 50, CV_8UC3, cv::Scalar(40, 200, 90));
  ASSERT_TRUE(codecs::write_image((dir_ / "b.jpg").string(), img));
  std::string lines;
  for (int i = 0; i < 6; ++i) {
    lines += video_line("long" + std::to_string(i), ", \"video\": \"long.avi\"", "<video>\\nWhat moves?");
    lines += video_line("mix" + std::to_string(i), ", \"images\": [\"b.jpg\", \"b.jpg\"], \"video\": \"short.mp4\"",
                        "<image><video><image> Describe.");
    lines += video_line("text" + std::to_string(i), "", "Hello.");
  }
  const std::string m = manifest_of("m.jsonl", lines);
  Tokenizer tok(tokenizer());
  DataConfig dc;
  dc.video.max_pixels = 30 * 28 * 28 * 4;  // 30 frames of 2x2 merged patches at most
  JsonlDataset direct(m, "", tok, geometry_, 4096, "fail", kDefaultMaxImagePixels, false, nullptr,
                      ChatTemplate::Dhp, dc.video);
  BuildOptions o = build_options(m);
  o.workers = 2;
  o.shard_bytes = 64 << 10;
  o.video = dc.video;
  const BuildSummary sum = build_dataset(o);
  ASSERT_TRUE(sum.complete);
  EXPECT_EQ(sum.video_frames, 6 * 30 + 6 * 4);
  ShardDataset shards(o.out_dir, tok, geometry_, 4096, "fail");
  ASSERT_EQ(shards.size(), direct.size());
  for (int64_t i = 0; i < shards.size(); ++i) {
    SCOPED_TRACE(direct.name(i));
    EXPECT_EQ(shards.length(i), direct.length(i));
    EXPECT_EQ(shards.vision_tokens(i), direct.vision_tokens(i));
    EXPECT_EQ(shards.images(i), direct.images(i));
    const Sample s = shards.load(i, false);
    expect_same(s, direct.load(i, false));
    EXPECT_EQ(int64_t(s.tokens.size()), shards.length(i));
  }
  EXPECT_EQ(direct.images(0), 30);
  // The long clip's 120x160 frames were shrunk to the budget of 3136 pixels a frame: 28x56
  // (1x2 merged patches), where a single image of that size keeps 112x168 (4x6).
  const Sample long0 = direct.load(0, false);
  EXPECT_EQ(long0.images[0].grid_h, 2);
  EXPECT_EQ(long0.images[0].grid_w, 4);
  EXPECT_EQ(direct.vision_tokens(0), 30 * 2);
  EXPECT_EQ(image_tokens(120, 160, geometry_), 4 * 6);
  // --reencode jpeg stores frames as JPEG: same lengths and grids, pixels within JPEG's error.
  BuildOptions oj = o;
  oj.out_dir = (dir_ / "built-jpeg").string();
  oj.reencode = "jpeg";
  ASSERT_TRUE(build_dataset(oj).complete);
  ShardDataset jpeg(oj.out_dir, tok, geometry_, 4096, "fail");
  for (int64_t i = 0; i < 3; ++i) {
    const Sample a = jpeg.load(i, false), b = shards.load(i, false);
    EXPECT_EQ(a.tokens, b.tokens);
    ASSERT_EQ(a.images.size(), b.images.size());
    for (size_t k = 0; k < a.images.size(); ++k) {
      ASSERT_EQ(a.images[k].pixels.size(), b.images[k].pixels.size());
      int worst = 0;
      for (size_t x = 0; x < a.images[k].pixels.size(); ++x)
        worst = std::max(worst, std::abs(int(a.images[k].pixels[x]) - int(b.images[k].pixels[x])));
      EXPECT_LE(worst, 24) << "sample " << i << " image " << k;
    }
  }
  // Training reads shards only: with the clips gone the built set still loads.
  fs::remove(dir_ / "long.avi");
  fs::remove(dir_ / "short.mp4");
  ShardDataset again(o.out_dir, tok, geometry_, 4096, "fail");
  expect_same(again.load(1, false), shards.load(1, false));
}

// Every bad video is skipped with its reason by the JSONL path and by the build alike.
TEST_F(VideoTest, BadVideosAreSkippedWithTheirReasonsByBothPaths) {
  write_clip(dir_ / "good.avi", 40, 10, 48, 64);
  // Truncated: the first 40% of a clip (its header states 40 frames).
  write_clip(dir_ / "full.avi", 40, 10, 48, 64);
  {
    const std::string bytes = read_text(dir_ / "full.avi");
    write_text(dir_ / "truncated.avi", bytes.substr(0, bytes.size() * 2 / 5));
  }
  // Zero decodable frames: an intact container whose every frame's data is overwritten.
  {
    std::string bytes = read_text(dir_ / "full.avi");
    size_t at = 0;
    while ((at = bytes.find(std::string("\xFF\xD8\xFF", 3), at)) != std::string::npos)
      for (size_t k = 0; k < 200 && at + k < bytes.size(); ++k) bytes[at + k] = char(0x11), ++at;
    write_text(dir_ / "nodecode.avi", bytes);
  }
  write_text(dir_ / "notvideo.mp4", "this is a text file, not a video\n");
  // A bad header: the RIFF signature and the AVI header list overwritten.
  {
    std::string bytes = read_text(dir_ / "full.avi");
    for (size_t k = 0; k < 64; ++k) bytes[k] = char(0x5A);
    write_text(dir_ / "badheader.avi", bytes);
  }
  // An unknown codec: the stream's codec tags renamed to one no decoder has.
  {
    std::string bytes = read_text(dir_ / "full.avi");
    const std::string head = bytes.substr(0, 4096);
    for (size_t at = head.find("MJPG"); at != std::string::npos; at = head.find("MJPG", at + 1))
      bytes.replace(at, 4, "QQZZ");
    write_text(dir_ / "unknowncodec.avi", bytes);
  }
  write_clip(dir_ / "big.avi", 12, 10, 224, 256);         // 57344 pixels a frame
  write_clip(dir_ / "long.avi", 400, 10, 128, 128);       // 40 s: 40 frames of 25 tokens
  ASSERT_EQ(mkfifo((dir_ / "fifo.avi").c_str(), 0600), 0);
  fs::create_directories(*root_ / "outside");
  write_clip(*root_ / "outside" / "escape.avi", 20, 10, 48, 64);

  struct Case {
    std::string id, media, human, reason;
  };
  const std::vector<Case> cases = {
      {"ok", ", \"video\": \"good.avi\"", "<video>", ""},
      {"truncated", ", \"video\": \"truncated.avi\"", "<video>", "truncated video"},
      {"nodecode", ", \"video\": \"nodecode.avi\"", "<video>", "corrupt video"},
      {"notvideo", ", \"video\": \"notvideo.mp4\"", "<video>", "unreadable video"},
      {"badheader", ", \"video\": \"badheader.avi\"", "<video>", "unreadable video"},
      {"unknowncodec", ", \"video\": \"unknowncodec.avi\"", "<video>", "unreadable video"},
      {"big", ", \"video\": \"big.avi\"", "<video>", "video too large"},
      {"toolong", ", \"video\": \"long.avi\"", "<video>", "too long"},
      {"fifo", ", \"video\": \"fifo.avi\"", "<video>", "unreadable video"},
      {"escape", ", \"video\": \"../outside/escape.avi\"", "<video>", "bad video path"},
      {"missing", ", \"video\": \"nothere.avi\"", "<video>", "missing video"},
      {"count", ", \"video\": \"good.avi\"", "<video> <video>", "video count mismatch"},
      {"answer", ", \"video\": \"good.avi\"", "Look.", "video count mismatch"},
  };
  std::string lines;
  std::map<std::string, int64_t> want;
  for (const Case& c : cases) {
    lines += video_line(c.id, c.media, c.human);
    if (!c.reason.empty()) ++want[c.reason];
  }
  const std::string m = manifest_of("m.jsonl", lines);
  Tokenizer tok(tokenizer());
  const int64_t max_pixels = 40000, max_tokens = 800;
  JsonlDataset ds(m, "", tok, geometry_, max_tokens, "skip", max_pixels);
  EXPECT_EQ(ds.size(), 1);
  EXPECT_EQ(ds.name(0), "ok");
  EXPECT_EQ(ds.skipped(), want);

  BuildOptions o = build_options(m);
  o.max_tokens = max_tokens;
  o.max_image_pixels = max_pixels;
  const BuildSummary sum = build_dataset(o);
  EXPECT_EQ(sum.samples, 1);
  EXPECT_EQ(sum.skipped, want);
  const std::string report = read_text(dir_ / "built" / kReportFile);
  EXPECT_NE(report.find("truncated.avi"), std::string::npos) << report;
  EXPECT_NE(report.find("fifo.avi"), std::string::npos) << report;

  // "fail" stops at the first bad line, naming it and its reason.
  try {
    JsonlDataset fail(m, "", tok, geometry_, max_tokens, "fail", max_pixels);
    ADD_FAILURE() << "a bad video was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(":2: truncated video"), std::string::npos) << e.what();
  }
}

// A clip that goes bad after indexing costs only its sample (a placeholder) in skip mode.
TEST_F(VideoTest, VideoThatGoesBadAfterIndexingCostsOnlyItsSample) {
  write_clip(dir_ / "a.avi", 30, 10, 48, 64);
  write_clip(dir_ / "b.avi", 30, 10, 48, 64);
  const std::string m = manifest_of("m.jsonl", video_line("a", ", \"video\": \"a.avi\"", "<video>") +
                                                   video_line("b", ", \"video\": \"b.avi\"", "<video>"));
  Tokenizer tok(tokenizer());
  JsonlDataset skip(m, "", tok, geometry_, 4096, "skip");
  JsonlDataset fail(m, "", tok, geometry_, 4096, "fail");
  const std::string bytes = read_text(dir_ / "a.avi");
  write_text(dir_ / "a.avi", bytes.substr(0, bytes.size() / 3));
  {
    LogCapture log;
    const Sample s = skip.load(0, false);
    EXPECT_TRUE(s.skipped);
    EXPECT_EQ(int64_t(s.tokens.size()), skip.length(0));
    EXPECT_NE(log.text().find("a.avi"), std::string::npos) << log.text();
  }
  EXPECT_EQ(skip.bad_loads(), 1);
  EXPECT_FALSE(skip.load(1, false).skipped);
  EXPECT_THROW(fail.load(0, false), Error);
}

// Every chat template places a clip's frames where its <video> marker stands.
TEST_F(VideoTest, EveryChatTemplateLaysOutClips) {
  write_clip(dir_ / "clip.avi", 50, 10, 48, 64);  // 5 s: five frames
  const cv::Mat img(56, 56, CV_8UC3, cv::Scalar(0, 0, 255));
  ASSERT_TRUE(codecs::write_image((dir_ / "a.png").string(), img));
  const std::string m = manifest_of(
      "m.jsonl", video_line("v", ", \"image\": \"a.png\", \"video\": \"clip.avi\"",
                            "<video> and <image> compared"));
  Tokenizer tok(tokenizer());
  for (const ChatTemplate t : {ChatTemplate::Dhp, ChatTemplate::LlavaV1, ChatTemplate::Plain}) {
    SCOPED_TRACE(std::string(template_name(t)));
    JsonlDataset ds(m, "", tok, geometry_, 4096, "fail", kDefaultMaxImagePixels, false, nullptr, t);
    ASSERT_EQ(ds.images(0), 6);
    const Sample s = ds.load(0, false);
    EXPECT_EQ(int64_t(s.tokens.size()), ds.length(0));
    // The frames come first (their marker does), in time order; then the red image.
    for (size_t k = 0; k < 5; ++k) EXPECT_EQ(frame_shown(s.images[k]), 5 + 10 * int(k)) << k;
    EXPECT_EQ(s.images[5].pixels[0], 255);
    // plain keeps no text of the human turn: the frames' timestamps are all that is left of it.
    if (t == ChatTemplate::Plain) {
      const std::vector<ImageSpan> spans = ds.image_spans(0);
      const std::vector<int32_t> stamp = tok.encode(frame_timestamp(0.5));
      EXPECT_EQ(spans[0].first, 1 + int64_t(stamp.size()) + 1);  // <bos> 0.5s <img>
    }
  }
}

TEST_F(VideoTest, GenerateLayoutRefusesVideoMarkers) {
  Tokenizer tok(tokenizer());
  std::vector<int32_t> layout;
  std::vector<uint8_t> loss;
  EXPECT_THROW(append_turn("<video> what?", false, tok, 0, layout, loss), LineError);
  layout.clear(), loss.clear();
  EXPECT_EQ(append_turn("<image> <video>", false, tok, 0, layout, loss, true), 1);
  EXPECT_EQ(layout, (std::vector<int32_t>{-1, kVideoMarker}));
}

// The preset writes real clips whose captions say what moves where; they build, report their
// lengths, and train a few steps on the CPU.
TEST_F(VideoTest, VideoLongtailPresetWritesClipsThatBuildAndTrain) {
  using dhp::testing::run_dhp;
  const fs::path data = dir_ / "longtail";
  auto r = run_dhp("data synth --preset video-longtail --out " + data.string() +
                       " --train 60 --val 6 --scale 0.25 --factor 16",
                   dir_);
  ASSERT_EQ(r.status, 0) << r.output;
  int64_t clips = 0, i = 0;
  const PresetParams p = preset_params("video-longtail");
  std::ifstream in(data / "train.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const SyntheticSample ss = preset_sample(p, (int64_t(1) << 40) + i++, 7, 16);
    if (!j.contains("video")) continue;
    ++clips;
    VideoReader v((data / j["video"].get<std::string>()).string(), "");
    EXPECT_EQ(v.info().frames, int64_t(ss.images.size()) * 4);  // n seconds at 4 fps
    const std::string answer = j["conversations"][1]["value"];
    EXPECT_NE(answer.find(" moves from "), std::string::npos) << answer;
    EXPECT_NE(j["conversations"][0]["value"].get<std::string>().find("<video>"), std::string::npos);
  }
  EXPECT_GT(clips, 0);
  const std::string cfg = fmt::format(
      "--config {}/configs/longtail.toml --data.train={}/train.jsonl --data.val={}/val.jsonl "
      "--data.tokenizer={}/tokenizer.model",
      DHP_SOURCE_DIR, data.string(), data.string(), data.string());
  r = run_dhp("data build --workers 2 --out " + (dir_ / "built").string() + " " + cfg, dir_);
  ASSERT_EQ(r.status, 0) << r.output;
  r = run_dhp("data stats --data " + (dir_ / "built").string() + " " + cfg, dir_);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("tokens"), std::string::npos) << r.output;
  r = run_dhp("train " + cfg + " --data.train=" + (dir_ / "built").string() +
                  " --data.val= --train.steps=3 --train.batch_size=4 --eval.every=0"
                  " --checkpoint.dir=" + (dir_ / "ck").string() +
                  " --log.metrics=" + (dir_ / "m.jsonl").string(),
              dir_, "", 300);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string metrics = read_text(dir_ / "m.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 3) << metrics;
  // Generation takes image files only: a <video> in its prompt is a message, not a crash.
  r = run_dhp("generate --dir " + (dir_ / "ck").string() + " --prompt \"What moves in <video>?\"",
              dir_);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--prompt: a <video> marker where only images can go"),
            std::string::npos)
      << r.output;
}

// A file under a video's name that names other files (an HLS playlist, an ffconcat script, a
// DASH manifest, an image-sequence pattern) is never followed out of the data root: each line
// is skipped as an unreadable video, and nothing of the clip outside reaches a sample or a
// shard. The control first shows that FFmpeg left to itself does follow the playlist.
TEST_F(VideoTest, FilesThatNameOtherFilesAreNeverFollowed) {
  const fs::path outside = *root_ / "outside_media";
  fs::create_directories(outside);
  write_clip(outside / "secret.avi", 20, 10, 48, 64);
  const std::string secret = fs::absolute(outside / "secret.avi").string();
  write_clip(dir_ / "good.avi", 40, 10, 48, 64);
  const std::string hls = "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXT-X-MEDIA-SEQUENCE:0\n#EXTINF:2.0,\n";
  write_text(dir_ / "hls_abs.mp4", hls + secret + "\n#EXT-X-ENDLIST\n");
  write_text(dir_ / "hls_url.mp4", hls + "file:" + secret + "\n#EXT-X-ENDLIST\n");
  write_text(dir_ / "concat_abs.mp4", "ffconcat version 1.0\nfile '" + secret + "'\n");
  write_text(dir_ / "concat_fd.mp4", "ffconcat version 1.0\nfile '/proc/self/fd/3'\n");
  write_text(dir_ / "dash.mp4",
             "<?xml version=\"1.0\"?>\n<MPD xmlns=\"urn:mpeg:dash:schema:mpd:2011\" type=\"static\" "
             "mediaPresentationDuration=\"PT2S\"><Period><AdaptationSet><Representation id=\"0\" "
             "bandwidth=\"1000\"><BaseURL>file://" + secret +
                 "</BaseURL></Representation></AdaptationSet></Period></MPD>\n");
  // An image-sequence pattern: files that exist under the pattern's name and its expansions.
  codecs::write_image((dir_ / "seq%03d.png").string(), cv::Mat(48, 64, CV_8UC3, cv::Scalar(1, 2, 3)));
  for (int i = 1; i <= 3; ++i)
    codecs::write_image((outside / fmt::format("seq{:03d}.png", i)).string(), cv::Mat(48, 64, CV_8UC3, cv::Scalar(9, 9, 9)));

  // The control, in a child process whose FFmpeg options are its own: unconfined, the playlist
  // opens and plays the clip outside; with dhp's options the same open fails, and the clip
  // itself still opens.
  auto child_opens = [&](const fs::path& file, const char* options) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (options) ::setenv("OPENCV_FFMPEG_CAPTURE_OPTIONS", options, 1);
      else ::unsetenv("OPENCV_FFMPEG_CAPTURE_OPTIONS");
      codecs::VideoCapture cap;
      cv::Mat m;
      ::_exit(cap.open(file.string(), cv::CAP_FFMPEG) && cap.read(m) && !m.empty() ? 0 : 1);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  const std::string confined = confined_ffmpeg_options();
  EXPECT_TRUE(child_opens(dir_ / "hls_abs.mp4", nullptr)) << "FFmpeg no longer follows playlists: the control is void";
  EXPECT_FALSE(child_opens(dir_ / "hls_abs.mp4", confined.c_str()));
  EXPECT_FALSE(child_opens(dir_ / "hls_url.mp4", confined.c_str()));
  EXPECT_TRUE(child_opens(outside / "secret.avi", confined.c_str()));
  EXPECT_TRUE(child_opens(dir_ / "good.avi", confined.c_str()));

  std::string lines = video_line("ok", ", \"video\": \"good.avi\"", "<video>");
  const std::vector<std::string> bad = {"hls_abs.mp4", "hls_url.mp4", "concat_abs.mp4", "concat_fd.mp4",
                                        "dash.mp4", "seq%03d.png"};
  for (const auto& f : bad) lines += video_line(f, ", \"video\": \"" + f + "\"", "<video>");
  const std::string m = manifest_of("m.jsonl", lines);
  Tokenizer tok(tokenizer());
  JsonlDataset ds(m, "", tok, geometry_, 800, "skip", 40000);
  EXPECT_EQ(ds.size(), 1);
  EXPECT_EQ(ds.name(0), "ok");
  EXPECT_EQ(ds.skipped(), (std::map<std::string, int64_t>{{"unreadable video", int64_t(bad.size())}}));

  BuildOptions o = build_options(m);
  o.max_tokens = 800;
  o.max_image_pixels = 40000;
  const BuildSummary sum = build_dataset(o);
  EXPECT_EQ(sum.samples, 1);
  const std::string report = read_text(dir_ / "built" / kReportFile);
  for (const char* named : {"an HLS playlist", "an ffconcat script", "an XML document"})
    EXPECT_NE(report.find(named), std::string::npos) << named << "\n" << report;
}

}  // namespace
}  // namespace dhp
