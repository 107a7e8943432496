// data/: image preprocessing, tokenizer, the demo synth and JSONL manifests, on fixtures
// generated here.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "core/check.h"
#include "core/rng.h"
#include "data/codecs.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/loader.h"
#include "data/pack.h"
#include "data/resample.h"
#include "data/sampler.h"
#include "data/synth.h"
#include "data/tokenizer.h"

#include "tests/data_fixture.h"

namespace dhp {
namespace {

// ---- resize rule --------------------------------------------------------------------------

struct ResizeCase {
  int H, W, want_h, want_w;
};

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find(library) != std::string::npos) return true;
  return false;
}

// OpenCV's imgcodecs and videoio (and FFmpeg under them) are not loaded with the program: the
// first decode loads libdhp_codecs.so, which brings them; then an encode and decode round trip
// through it.
TEST(Codecs, LoadedByTheFirstDecodeOnly) {
  if (mapped("libdhp_codecs.so")) GTEST_SKIP() << "another test of this process loaded the codecs first";
  EXPECT_FALSE(mapped("libopencv_imgcodecs")) << "imgcodecs is linked into the program";
  EXPECT_FALSE(mapped("libopencv_videoio")) << "videoio is linked into the program";
  EXPECT_FALSE(mapped("libavcodec"));
  const cv::Mat img(7, 5, CV_8UC3, cv::Scalar(10, 20, 30));
  std::vector<uint8_t> png;
  ASSERT_TRUE(codecs::encode_image(".png", img, png, {}));
  EXPECT_TRUE(mapped("libdhp_codecs.so"));
  EXPECT_TRUE(mapped("libopencv_imgcodecs"));
  const cv::Mat back = codecs::decode_image(png.data(), png.size(), cv::IMREAD_COLOR);
  ASSERT_EQ(back.rows, 7);
  EXPECT_EQ(cv::norm(back, img, cv::NORM_INF), 0.0);
  EXPECT_TRUE(codecs::decode_image(png.data(), png.size() / 2, cv::IMREAD_COLOR).empty());
}

TEST(Image, ResizeRuleHandComputed) {
  ImageGeometry v;  // p = 14, m = 2 -> f = 28; pixels in [256, 65536]
  const std::vector<ResizeCase> plain = {
      {28, 28, 28, 28},     // already a multiple
      {100, 50, 112, 56},   // r(3.57) = 4, r(1.79) = 2
      {32, 192, 28, 196},   // strip: r(1.14) = 1, r(6.86) = 7
      {10, 500, 28, 504},   // r(0.36) = 0 is lifted to f
      {70, 70, 84, 84},     // r(2.5) = 3: floor(x + 0.5), not round-half-even
      {1000, 1000, 252, 252},  // max branch: b = 3.90625, floor(9.14) * 28
      {300, 2000, 84, 644},    // max branch, odd aspect: floor(3.54), floor(23.6)
      {20, 5000, 28, 2324},    // max branch lifts h to f (28 x 4032), the clamp: floor(83.6)
  };
  for (const auto& c : plain) {
    const ImageSize s = resized_size(c.H, c.W, v);
    EXPECT_EQ(s.h, c.want_h) << c.H << "x" << c.W;
    EXPECT_EQ(s.w, c.want_w) << c.H << "x" << c.W;
  }
  ImageGeometry small = v;
  small.min_pixels = 10000;  // min branch: b = sqrt(10000 / 1200) = 2.887
  EXPECT_EQ(resized_size(30, 40, small).h, 112);  // ceil(3.09) * 28
  EXPECT_EQ(resized_size(30, 40, small).w, 140);  // ceil(4.12) * 28
  small.min_pixels = 20000;  // odd aspect: b = sqrt(20), ceil(0.80), ceil(31.9)
  EXPECT_EQ(resized_size(5, 200, small).h, 28);
  EXPECT_EQ(resized_size(5, 200, small).w, 896);
  ImageGeometry p16;
  p16.patch = 16;
  p16.merge = 1;
  p16.min_pixels = 1024;  // b = 4 exactly: ceil(2.0) must stay 2
  EXPECT_EQ(resized_size(8, 8, p16).h, 32);
  EXPECT_EQ(resized_size(8, 8, p16).w, 32);

  EXPECT_EQ(image_tokens(100, 50, v), 4 * 2);
  EXPECT_EQ(image_tokens(32, 192, v), 1 * 7);
  EXPECT_EQ(image_tokens(8, 8, p16), 2 * 2);
}

// Extreme aspect ratios under the demo's settings (f = 16, max_pixels = 16384): the floors of
// the max branch lift the short side to f and would give 16 x 2160 for 5 x 1426; the final
// clamp shortens the long side to floor(16384 / (16 * 16)) * 16 = 1024.
TEST(Image, ResizeClampHoldsTheCapOnExtremeAspectRatios) {
  ImageGeometry demo;
  demo.patch = 8;
  demo.merge = 2;
  demo.min_pixels = 1024;
  demo.max_pixels = 16384;
  const std::vector<ResizeCase> extreme = {
      {5, 1426, 16, 1024},
      {1426, 5, 1024, 16},
      {1, 100000, 16, 1024},
      {100000, 1, 1024, 16},
      {40, 1426, 16, 752},  // the max branch alone already fits: no clamp
  };
  for (const auto& c : extreme) {
    const ImageSize s = resized_size(c.H, c.W, demo);
    EXPECT_EQ(s.h, c.want_h) << c.H << "x" << c.W;
    EXPECT_EQ(s.w, c.want_w) << c.H << "x" << c.W;
  }
  EXPECT_EQ(image_tokens(5, 1426, demo), 1 * 64);  // the demo config's "at most 64" holds

  // The min branch's ceilings can also overshoot when min_pixels is close to max_pixels.
  ImageGeometry tight;  // f = 28
  tight.min_pixels = tight.max_pixels = 10000;
  EXPECT_EQ(resized_size(30, 40, tight).h, 112);  // 112 x 140 -> shorter 112
  EXPECT_EQ(resized_size(30, 40, tight).w, 84);   // floor(10000 / (112 * 28)) = 3

  // The guarantee: h·w <= max_pixels whenever f² <= max_pixels, sides multiples of f and >= f.
  std::mt19937 rng(7);
  for (const int64_t cap : {int64_t(256), int64_t(1000), int64_t(16384), int64_t(65536)}) {
    ImageGeometry v = demo;
    v.max_pixels = cap;
    v.min_pixels = std::min<int64_t>(256, cap);
    for (int t = 0; t < 2000; ++t) {
      const int H = 1 + int(rng() % (t % 2 ? 20 : 5000)), W = 1 + int(rng() % 100000);
      const ImageSize s = t % 4 < 2 ? resized_size(H, W, v) : resized_size(W, H, v);
      ASSERT_LE(int64_t(s.h) * s.w, cap) << H << "x" << W << " cap " << cap;
      ASSERT_TRUE(s.h >= 16 && s.w >= 16 && s.h % 16 == 0 && s.w % 16 == 0)
          << H << "x" << W << " -> " << s.h << "x" << s.w;
    }
  }
}

// ---- headers -------------------------------------------------------------------------------

// model.vision.resize = "qwen" is transformers' smart_resize (tests/reference/smart_resize_ref.py)
// on 600 sizes at Qwen2-VL's factor 28 and Qwen3-VL's 32 with their pixel budgets and tight
// ones, the sides an exact half-factor away (Python's round goes to even there), tiny and huge
// images, and aspect ratios around 200 (above it refused, as the processor refuses). The
// negative control: dhp's native rule differs from it on some of these sizes. The pixels are
// Pillow's bicubic resize to that size (data/resample.h; tests/test_resample.cpp).
TEST(Image, QwenResizeIsTransformersSmartResize) {
  namespace fs = std::filesystem;
  struct Budget {
    int patch;
    int64_t min_pixels, max_pixels;
  };
  const std::vector<Budget> budgets = {{14, 56 * 56, 28 * 28 * 1280}, {16, 64 * 64, 16384 * 32 * 32},
                                       {16, 4096, 65536}, {14, 100000, 120000}};
  Rng rng(5);
  std::vector<std::array<int64_t, 5>> cases;
  for (const Budget& b : budgets) {
    const int f = 2 * b.patch;
    for (int k = 0; k < 150; ++k) {
      int h = 0, w = 0;
      switch (k % 5) {
        case 0: h = 1 + int(rng.below(4000)), w = 1 + int(rng.below(4000)); break;
        case 1: h = f / 2 + f * int(rng.below(40)), w = f / 2 + f * int(rng.below(40)); break;  // halves
        case 2: h = 1 + int(rng.below(40)), w = 1 + int(rng.below(40)); break;                  // tiny
        case 3: h = 1 + int(rng.below(60)), w = int(h * (150 + rng.below(100))); break;        // ~200:1
        default: h = 2000 + int(rng.below(20000)), w = 2000 + int(rng.below(20000)); break;     // huge
      }
      cases.push_back({h, w, f, b.min_pixels, b.max_pixels});
    }
  }
  const fs::path dir = fs::temp_directory_path() / ("dhp_smart_resize_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "cases.json") << nlohmann::json(cases).dump();
  const std::string cmd = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/smart_resize_ref.py " +
                          (dir / "cases.json").string() + " " + (dir / "out.json").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json want = nlohmann::json::parse(std::ifstream(dir / "out.json"));
  fs::remove_all(dir);
  int refused = 0, differs_from_native = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    ImageGeometry v;
    v.patch = int(c[2]) / 2;
    v.merge = 2;
    v.min_pixels = c[3];
    v.max_pixels = c[4];
    v.resize = ImageFit::qwen;
    SCOPED_TRACE(::testing::Message() << c[0] << "x" << c[1] << " factor " << c[2] << " pixels [" << c[3] << ", " << c[4] << "]");
    if (want[i].is_null()) {
      ++refused;
      EXPECT_THROW(resized_size(int(c[0]), int(c[1]), v), Error);
      continue;
    }
    const ImageSize s = resized_size(int(c[0]), int(c[1]), v);
    EXPECT_EQ(s.h, want[i][0].get<int>());
    EXPECT_EQ(s.w, want[i][1].get<int>());
    v.resize = ImageFit::native;
    try {
      const ImageSize n = resized_size(int(c[0]), int(c[1]), v);
      differs_from_native += n.h != s.h || n.w != s.w;
    } catch (const Error&) {
      ++differs_from_native;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(differs_from_native, 0) << "the native rule is transformers' on every case: the test cannot tell them apart";

  // The pixels: Pillow's bicubic to that size, patches row-major.
  cv::Mat bgr(37, 90, CV_8UC3);
  cv::randu(bgr, 0, 255);
  ImageGeometry q;
  q.patch = 4;
  q.merge = 2;
  q.min_pixels = 64;
  q.max_pixels = 4000;
  q.resize = ImageFit::qwen;
  const ImageSize s = resized_size(37, 90, q);
  const PreparedImage im = prepare_image(bgr, q);
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  const cv::Mat want_px = pil_resize_bicubic(rgb, s.w, s.h);
  ASSERT_EQ(im.grid_h * q.patch, s.h);
  ASSERT_EQ(im.grid_w * q.patch, s.w);
  for (int y = 0; y < s.h; ++y)
    for (int x = 0; x < s.w; ++x)
      for (int ch = 0; ch < 3; ++ch)
        ASSERT_EQ(im.pixels[size_t(((y / q.patch) * im.grid_w + x / q.patch) * q.patch_numel() +
                                   ((y % q.patch) * q.patch + x % q.patch) * 3 + ch)],
                  want_px.at<cv::Vec3b>(y, x)[ch])
            << y << "," << x;
}

TEST_F(DataTest, HeaderSizeEqualsDecodedSize) {
  cv::Mat img(37, 91, CV_8UC3, cv::Scalar(10, 200, 30));
  cv::Mat tall(120, 33, CV_8UC3, cv::Scalar(90, 20, 230));
  const fs::path d = *root_ / "headers";
  fs::create_directories(d);
  struct File {
    std::string name;
    const cv::Mat* m;
    std::vector<int> params;
  };
  const std::vector<File> files = {
      {"a.png", &img, {}},
      {"b.jpg", &img, {}},
      {"c.png", &tall, {}},
      {"d.jpg", &tall, {cv::IMWRITE_JPEG_PROGRESSIVE, 1}},  // SOF2 rather than SOF0
  };
  for (const auto& f : files) {
    const std::string p = (d / f.name).string();
    ASSERT_TRUE(codecs::write_image(p, *f.m, f.params));
    const ImageSize s = read_image_size(p);
    const cv::Mat back = codecs::read_image(p, cv::IMREAD_COLOR);
    EXPECT_EQ(s.h, back.rows) << f.name;
    EXPECT_EQ(s.w, back.cols) << f.name;
    EXPECT_EQ(s.h, f.m->rows) << f.name;
  }
  // Truncated headers and foreign formats are user errors that name the file.
  const std::string png = read_text(d / "a.png"), jpg = read_text(d / "b.jpg");
  write_text(d / "t.png", png.substr(0, 20));
  write_text(d / "t.jpg", jpg.substr(0, 30));
  write_text(d / "x.gif", "GIF89a........");
  for (const char* name : {"t.png", "t.jpg", "x.gif", "absent.png"}) {
    const std::string p = (d / name).string();
    try {
      read_image_size(p);
      ADD_FAILURE() << name << " should not parse";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
}

// ---- patches -------------------------------------------------------------------------------
// LLaVA-1.5's pad: the image centred on a square of its longer side in the tower's mean
// colour, then resized to image_size; min_pixels and max_pixels do not apply.
TEST(Image, PadSquareCentresOnTheMeanColour) {
  ImageGeometry v;  // patch 14, merge 2
  v.resize = ImageFit::pad_square;
  v.image_size = 56;
  v.pixel_mean = kSiglipPixelMean;  // pads in 127 grey: int(0.5 * 255), as LLaVA
  const int H = 28, W = 56, p = v.patch;
  cv::Mat bgr(H, W, CV_8UC3);
  auto value = [](int y, int x, int c) { return (y * 7 + x * 3 + c * 50) % 200; };  // RGB
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) bgr.at<cv::Vec3b>(y, x)[2 - c] = uint8_t(value(y, x, c));
  EXPECT_EQ(resized_size(H, W, v).h, 56);
  EXPECT_EQ(resized_size(7, 3000, v).w, 56);
  const PreparedImage im = prepare_image(bgr, v);
  ASSERT_EQ(im.grid_h, 4);
  ASSERT_EQ(im.grid_w, 4);
  // 56 x 56 needs no resize: rows 14..41 are the image, the rest the pad.
  for (int y = 0; y < 56; ++y)
    for (int x = 0; x < 56; ++x)
      for (int c = 0; c < 3; ++c) {
        const int64_t i = ((y / p) * 4 + x / p) * v.patch_numel() + ((y % p) * p + x % p) * 3 + c;
        const int want = y >= 14 && y < 42 ? value(y - 14, x, c) : 127;
        ASSERT_EQ(im.pixels[size_t(i)], want) << y << "," << x << "," << c;
      }
  // A tall image pads left and right (floored offset: 3 columns left, 4 right), then resizes.
  cv::Mat tall(70, 63, CV_8UC3, cv::Scalar(0, 0, 255));  // red in BGR
  v.pixel_mean = kClipPixelMean;
  const PreparedImage t = prepare_image(tall, v);
  ASSERT_EQ(t.grid_h, 4);
  ASSERT_EQ(t.grid_w, 4);
  const auto pad = v.pad_rgb();
  EXPECT_EQ(pad[0], 122);
  EXPECT_EQ(pad[1], 116);
  EXPECT_EQ(pad[2], 104);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(t.pixels[size_t(c)], pad[size_t(c)]);  // (0, 0): pad
  // Blanked images take the nearest colour instead (normalised to within 0.5/255/std of 0).
  EXPECT_EQ(v.mean_rgb()[0], 123);
  EXPECT_EQ(v.mean_rgb()[1], 117);
  const int64_t centre = (1 * 4 + 1) * v.patch_numel() + (13 * p + 13) * 3;  // (27, 27)
  EXPECT_EQ(t.pixels[size_t(centre)], 255);
  EXPECT_EQ(t.pixels[size_t(centre + 1)], 0);
  EXPECT_EQ(image_tokens(70, 63, v), 4);
  // blank() takes the tower's colour.
  PreparedImage b = im;
  blank(b, ImageGeometry{.pixel_mean = kSiglipPixelMean}.mean_rgb());
  for (uint8_t x : b.pixels) ASSERT_EQ(x, 128);
}


TEST(Image, PatchLayoutKnownPixels) {
  ImageGeometry v;  // 28 x 56 needs no resize: a 2 x 4 patch grid
  const int H = 28, W = 56, p = v.patch;
  cv::Mat bgr(H, W, CV_8UC3);
  auto value = [](int y, int x, int c) { return (y * 7 + x * 3 + c * 50) % 256; };  // RGB
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) bgr.at<cv::Vec3b>(y, x)[2 - c] = uint8_t(value(y, x, c));
  const PreparedImage im = prepare_image(bgr, v);
  ASSERT_EQ(im.grid_h, 2);
  ASSERT_EQ(im.grid_w, 4);
  ASSERT_EQ(int64_t(im.pixels.size()), 8 * v.patch_numel());
  // One pixel by hand: (y=17, x=45) is patch (1, 3) = index 7, offset (dy=3, dx=3).
  const int64_t base = 7 * v.patch_numel() + (3 * p + 3) * 3;
  for (int c = 0; c < 3; ++c) EXPECT_EQ(im.pixels[size_t(base + c)], value(17, 45, c));
  // And every pixel against the layout formula.
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) {
        const int64_t i = ((y / p) * 4 + x / p) * v.patch_numel() + ((y % p) * p + x % p) * 3 + c;
        ASSERT_EQ(im.pixels[size_t(i)], value(y, x, c)) << y << "," << x;
      }
  PreparedImage b = im;
  blank(b);
  EXPECT_EQ(b.grid_h, 2);
  // The mean colour: normalised, within half a grey level of 0.
  for (size_t i = 0; i < b.pixels.size(); ++i)
    ASSERT_NEAR(b.pixels[i] / 255.0f, float(kClipPixelMean[i % 3]), 0.5f / 255.0f) << i;
  // A size off the grid is resized to resized_size() (30 x 40 -> 28 x 28 -> 2 x 2 patches).
  const PreparedImage r = prepare_image(cv::Mat(30, 40, CV_8UC3, cv::Scalar(0, 0, 255)), v);
  EXPECT_EQ(r.grid_h, 2);
  EXPECT_EQ(r.grid_w, 2);
  EXPECT_EQ(r.pixels[0], 255);  // red survives BGR -> RGB
  EXPECT_EQ(r.pixels[2], 0);
}

// ---- tokenizer -----------------------------------------------------------------------------

TEST_F(DataTest, TokenizerReservedIdsAndRoundTrip) {
  Tokenizer tok(tokenizer());
  // dhp's own model: the reserved ids every earlier data set and checkpoint was made with.
  EXPECT_EQ(format_special_ids(tok.ids()), "pad=0 unk=1 bos=2 eos=3 image=-1 img=4 /img=5");
  EXPECT_TRUE(tok.added_tokens().empty());
  EXPECT_GT(tok.vocab_size(), 6);
  EXPECT_LE(tok.vocab_size(), 160);
  const std::string text = "two red circles at the top left and a blue square on the right.";
  const auto ids = tok.encode(text);
  EXPECT_FALSE(ids.empty());
  for (int32_t id : ids) EXPECT_GT(id, tok.ids().img_end);  // no reserved id from plain text
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.decode({tok.ids().bos, ids[0], tok.ids().eos}), tok.decode({ids[0]}));
  const auto img = tok.encode("<img></img>");
  EXPECT_NE(std::find(img.begin(), img.end(), tok.ids().img_begin), img.end());
  EXPECT_NE(std::find(img.begin(), img.end(), tok.ids().img_end), img.end());

  EXPECT_THROW(Tokenizer((*root_ / "absent.model").string()), Error);
  write_text(*root_ / "corrupt.model", "this is not a protobuf");
  EXPECT_THROW(Tokenizer((*root_ / "corrupt.model").string()), Error);
}

// ---- synth ---------------------------------------------------------------------------------

TEST_F(DataTest, SynthIsDeterministicAndVaried) {
  SynthOptions o;
  o.train = 48;
  o.val = 8;
  o.seed = 11;
  o.out_dir = (*root_ / "again").string();
  synthesize(o);
  int64_t files = 0, png = 0, jpg = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir())) {
    if (!e.is_regular_file()) continue;
    const fs::path rel = fs::relative(e.path(), dir());
    ASSERT_EQ(read_text(e.path()), read_text(*root_ / "again" / rel)) << rel;
    ++files;
    png += e.path().extension() == ".png";
    jpg += e.path().extension() == ".jpg";
  }
  EXPECT_EQ(files, 48 + 8 + 3);  // images, two manifests, the tokenizer
  EXPECT_GT(png, 0);
  EXPECT_GT(jpg, 0);

  // Captions follow the grammar (with number agreement); image shapes vary widely.
  const std::string g =
      "(a|two|three) (red|green|blue|yellow|purple|black) (circle|square|triangle)s? "
      "(in the center|on the (left|right)|at the (top|bottom)( (left|right))?)";
  const std::regex grammar(g + "((, " + g + ")* and " + g + ")?\\.");
  const std::regex singular_plural("(^|, | and )a [a-z]+ [a-z]+s ");
  const std::regex plural_singular("(two|three) [a-z]+ (circle|square|triangle) ");
  std::ifstream in(manifest());
  std::string line;
  double min_aspect = 10, max_aspect = 0;
  std::set<std::string> distinct;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string cap = j["conversations"][1]["value"];
    distinct.insert(cap);
    EXPECT_TRUE(std::regex_match(cap, grammar)) << cap;
    EXPECT_FALSE(std::regex_search(cap, singular_plural)) << cap;
    EXPECT_FALSE(std::regex_search(cap, plural_singular)) << cap;
    const ImageSize s = read_image_size((dir() / std::string(j["image"])).string());
    min_aspect = std::min(min_aspect, double(s.w) / s.h);
    max_aspect = std::max(max_aspect, double(s.w) / s.h);
  }
  EXPECT_GT(distinct.size(), 40u);  // captions vary with the content
  EXPECT_LT(min_aspect, 0.5);
  EXPECT_GT(max_aspect, 2.0);
}

// ---- dataset -------------------------------------------------------------------------------

TEST_F(DataTest, LoadedLengthEqualsHeaderPrediction) {
  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  JsonlDataset ds(manifest(), "", tok, geometry, 4096, "fail");
  ASSERT_EQ(ds.size(), 48);
  std::ifstream in(manifest());
  for (int64_t i = 0; i < ds.size(); ++i) {
    std::string line;
    std::getline(in, line);
    const auto j = nlohmann::json::parse(line);
    const Sample s = ds.load(i, false);
    ASSERT_EQ(int64_t(s.tokens.size()), ds.length(i)) << i;
    ASSERT_EQ(s.loss_mask.size(), s.tokens.size());
    ASSERT_EQ(s.image_of.size(), s.tokens.size());
    ASSERT_EQ(s.images.size(), 1u);
    EXPECT_EQ(s.id, i);
    EXPECT_EQ(s.tokens.front(), tok.ids().bos);
    EXPECT_EQ(s.tokens.back(), tok.ids().eos);
    EXPECT_EQ(s.loss_mask.back(), 1);
    // Image tokens: exactly the merged grid of the decoded image, between <img> and </img>.
    const int64_t n_img = std::count(s.image_of.begin(), s.image_of.end(), 0);
    const ImageSize hdr = read_image_size((dir() / std::string(j["image"])).string());
    EXPECT_EQ(n_img, image_tokens(hdr.h, hdr.w, geometry));
    EXPECT_EQ(n_img, int64_t(s.images[0].grid_h / 2) * (s.images[0].grid_w / 2));
    const auto first = std::find(s.image_of.begin(), s.image_of.end(), 0) - s.image_of.begin();
    EXPECT_EQ(s.tokens[size_t(first - 1)], tok.ids().img_begin);
    EXPECT_EQ(s.tokens[size_t(first + n_img)], tok.ids().img_end);
    // The loss covers exactly the caption and <eos>.
    std::vector<int32_t> answer;
    for (size_t t = 0; t < s.tokens.size(); ++t)
      if (s.loss_mask[t] && s.tokens[t] != tok.ids().eos) answer.push_back(s.tokens[t]);
    EXPECT_EQ(tok.decode(answer), std::string(j["conversations"][1]["value"]));
    EXPECT_EQ(int64_t(answer.size()) + 1, ds.loss_tokens(i));
  }
  const Sample b = ds.load(3, true);
  EXPECT_EQ(b.tokens, ds.load(3, false).tokens);
  for (size_t i = 0; i < b.images[0].pixels.size(); ++i)  // the mean colour
    ASSERT_EQ(b.images[0].pixels[i], uint8_t(std::lround(float(kClipPixelMean[i % 3]) * 255.0f))) << i;
}


TEST_F(DataTest, BadLinesAreSkippedAndCounted) {
  const fs::path d = *root_ / "bad";
  fs::create_directories(d / "images");
  fs::copy_file(dir() / "images" / "train-000000.png", d / "images" / "ok.png",
                fs::copy_options::overwrite_existing);
  fs::copy_file(dir() / "images" / "train-000001.png", d / "images" / "ok2.png",
                fs::copy_options::overwrite_existing);
  write_text(d / "images" / "corrupt.png", "\x89PNG garbage bytes");
  const std::string img = ", \"image\": \"images/ok.png\"";
  std::string m;
  m += line_json("good", img, "<image>\\nDescribe the image.", "a red circle in the center.");
  m += "{\"id\": \"broken\", \"image\": \n";                                        // line 2
  m += line_json("nofile", ", \"image\": \"images/nope.png\"", "<image>", "a red circle.");
  m += line_json("corrupt", ", \"image\": \"images/corrupt.png\"", "<image>", "a circle.");
  m += line_json("empty", img, "<image>\\nDescribe the image.", "");               // line 5
  m += line_json("text", "", "What is a square?", "a square has four sides.");
  m += line_json("two", ", \"images\": [\"images/ok.png\", \"images/ok2.png\"]",
                 "<image> and <image>", "two blue squares.");                       // line 7
  m += "\n";
  m += line_json("mismatch", img, "Describe the image.", "a red circle.");          // line 9
  write_text(d / "bad.jsonl", m);
  const std::string path = (d / "bad.jsonl").string();

  Tokenizer tok(tokenizer());
  ImageGeometry geometry;
  std::string log;
  {
    LogCapture cap;
    JsonlDataset ds(path, "", tok, geometry, 4096, "skip");
    log = cap.text();
    EXPECT_EQ(ds.size(), 3);
    EXPECT_EQ(ds.name(0), "good");
    EXPECT_EQ(ds.name(1), "text");
    EXPECT_EQ(ds.name(2), "two");
    const std::map<std::string, int64_t> want = {{"invalid json", 1},
                                                 {"missing image", 1},
                                                 {"unreadable image", 1},
                                                 {"empty text", 1},
                                                 {"image count mismatch", 1}};
    EXPECT_EQ(ds.skipped(), want);

    const Sample text = ds.load(1, false);  // text only: no image tokens at all
    EXPECT_EQ(int64_t(text.tokens.size()), ds.length(1));
    EXPECT_TRUE(text.images.empty());
    EXPECT_EQ(std::count(text.image_of.begin(), text.image_of.end(), -1),
              int64_t(text.tokens.size()));
    const Sample two = ds.load(2, false);  // both images, in order, each in its own <img>
    EXPECT_EQ(int64_t(two.tokens.size()), ds.length(2));
    ASSERT_EQ(two.images.size(), 2u);
    EXPECT_EQ(std::count(two.tokens.begin(), two.tokens.end(), tok.ids().img_begin), 2);
    const auto first1 = std::find(two.image_of.begin(), two.image_of.end(), 1);
    const auto last0 = std::find(two.image_of.rbegin(), two.image_of.rend(), 0);
    EXPECT_LT(two.image_of.rend() - last0, first1 - two.image_of.begin());
  }
  for (const char* want : {":2: skipped (invalid json)", ":3: skipped (missing image)",
                           ":4: skipped (unreadable image)", ":5: skipped (empty text)",
                           ":9: skipped (image count mismatch)"})
    EXPECT_NE(log.find(path + want), std::string::npos) << want << "\n" << log;
  EXPECT_EQ(log.find(":8:"), std::string::npos) << "blank lines are not errors";

  try {
    JsonlDataset ds(path, "", tok, geometry, 4096, "fail");
    ADD_FAILURE() << "fail mode should throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2: invalid json"), std::string::npos)
        << e.what();
  }
  {
    LogCapture cap;  // a limit one below the longest sample skips exactly the longest
    int64_t longest = 0, n_longest = 0;
    {
      JsonlDataset ds(path, "", tok, geometry, 4096, "skip");
      for (int64_t i = 0; i < ds.size(); ++i) longest = std::max(longest, ds.length(i));
      for (int64_t i = 0; i < ds.size(); ++i) n_longest += ds.length(i) == longest;
    }
    ASSERT_LT(n_longest, 3);
    JsonlDataset ds(path, "", tok, geometry, longest - 1, "skip");
    EXPECT_EQ(ds.size(), 3 - n_longest);
    EXPECT_EQ(ds.skipped().at("too long"), n_longest);
    for (int64_t i = 0; i < ds.size(); ++i) EXPECT_LT(ds.length(i), longest);
  }
}

}  // namespace
}  // namespace dhp
