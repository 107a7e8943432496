// The Hugging Face image processors' pixels, checked against Pillow itself
// (tests/reference/pil_resize.py): Pillow's bicubic resize on 60 crops of real images (a photo,
// an MRI slice, two elevation maps) of varied sizes and aspect ratios, shrinking and enlarging,
// and the clip, siglip and pad_square pipelines of prepare_image.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <opencv2/imgproc.hpp>

#include "core/check.h"
#include "data/image.h"
#include "data/resample.h"
#include "tests/file_text.h"

namespace dhp {
namespace {

namespace fs = std::filesystem;

struct Case {
  int w, h, out_w, out_h, size;
};

// Pillow's outputs, made once per process and removed at its exit.
struct Removed {
  fs::path dir;
  ~Removed() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// The folder tests/reference/`script` makes, through the fixture cache: Pillow runs once per
// build, other test processes copy its folder.
fs::path pillow_fixture(const std::string& script) {
  const fs::path d = fs::temp_directory_path() / ("dhp_" + script + "_" + std::to_string(::getpid()));
  const std::string ref = "/usr/bin/python3 " + std::string(DHP_SOURCE_DIR) + "/tests/reference/";
  const std::string cmd = ref + "cached_fixture.py " + DHP_FIXTURE_CACHE + " '" + d.string() + "' " + script;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd << ": needs Debian's python3-pil, python3-numpy and python3-matplotlib";
  return d;
}

const fs::path& reference() {
  static const Removed made{pillow_fixture("pil_resize.py")};
  return made.dir;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const auto& c : nlohmann::json::parse(testing::read_text(reference() / "cases.json")))
    out.push_back({c["w"], c["h"], c["out_w"], c["out_h"], c["size"]});
  return out;
}

cv::Mat source_rgb(size_t i) {
  const std::vector<uint8_t> png = read_image_file((reference() / ("src_" + std::to_string(i) + ".png")).string());
  const cv::Mat bgr = decode_image(png.data(), png.size(), "src");
  cv::Mat rgb;
  cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
  return rgb;
}

struct Diff {
  int max = 0;
  int64_t differing = 0, total = 0;
};

Diff compare(const uint8_t* got, size_t n, const std::string& want) {
  Diff d;
  EXPECT_EQ(n, want.size());
  d.total = int64_t(std::min(n, want.size()));
  for (int64_t i = 0; i < d.total; ++i) {
    const int e = std::abs(int(got[i]) - int(uint8_t(want[size_t(i)])));
    d.max = std::max(d.max, e);
    d.differing += e != 0;
  }
  return d;
}

TEST(PilResize, EqualsPillowsBicubicOnRealImagesShrinkingAndEnlarging) {
  const auto all = cases();
  ASSERT_GE(all.size(), 50u);
  int shrinking = 0, enlarging = 0, opencv_worst = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const Case& c = all[i];
    const cv::Mat src = source_rgb(i);
    ASSERT_EQ(src.cols, c.w);
    ASSERT_EQ(src.rows, c.h);
    const cv::Mat got = pil_resize_bicubic(src, c.out_w, c.out_h);
    ASSERT_TRUE(got.isContinuous());
    const std::string want = testing::read_text(reference() / ("resized_" + std::to_string(i) + ".rgb"));
    const Diff d = compare(got.data, got.total() * 3, want);
    EXPECT_EQ(d.max, 0) << "case " << i << ": " << c.w << "x" << c.h << " -> " << c.out_w << "x" << c.out_h << ", "
                        << d.differing << " of " << d.total << " values differ";
    shrinking += c.out_w < c.w || c.out_h < c.h;
    enlarging += c.out_w > c.w || c.out_h > c.h;
    // The negative control: OpenCV's cubic, which the data path used before.
    cv::Mat cv_cubic;
    cv::resize(src, cv_cubic, cv::Size(c.out_w, c.out_h), 0, 0, cv::INTER_CUBIC);
    opencv_worst = std::max(opencv_worst, compare(cv_cubic.data, cv_cubic.total() * 3, want).max);
  }
  EXPECT_GE(shrinking, 10);
  EXPECT_GE(enlarging, 10);
  EXPECT_GT(opencv_worst, 20) << "OpenCV's cubic must differ from Pillow's, or this test could not fail";
  std::printf("%zu cases (%d shrink an axis, %d enlarge one): all equal to Pillow's; OpenCV's cubic differs by up to "
              "%d grey levels\n", all.size(), shrinking, enlarging, opencv_worst);
}

// prepare_image's clip, siglip and pad_square: the square processors' own pipelines, pixel for
// pixel (the modes that keep each image's resolution, native and qwen, are tests/test_data.cpp's).
TEST(PilResize, PrepareImageIsTheHuggingFaceProcessorsPipeline) {
  const auto all = cases();
  for (const auto& [fit, name] : kImageFitNames) {
    ImageGeometry mode;
    mode.resize = fit;
    if (!mode.fixed_square()) continue;
    for (size_t i = 0; i < all.size(); ++i) {
      const Case& c = all[i];
      ImageGeometry g;
      g.patch = 14, g.merge = 2, g.resize = fit, g.image_size = c.size;
      g.pixel_mean = kClipPixelMean;
      cv::Mat bgr;
      cv::cvtColor(source_rgb(i), bgr, cv::COLOR_RGB2BGR);
      const PreparedImage p = prepare_image(bgr, g);
      ASSERT_EQ(p.grid_h * 14, c.size);
      ASSERT_EQ(p.grid_w * 14, c.size);
      // The patches back into rows.
      std::vector<uint8_t> rows(size_t(c.size) * size_t(c.size) * 3);
      for (int y = 0; y < c.size; ++y)
        for (int x = 0; x < c.size; ++x)
          for (int ch = 0; ch < 3; ++ch)
            rows[(size_t(y) * size_t(c.size) + size_t(x)) * 3 + size_t(ch)] =
                p.pixels[size_t(((y / 14) * p.grid_w + x / 14) * g.patch_numel() + ((y % 14) * 14 + x % 14) * 3 + ch)];
      const std::string want = testing::read_text(reference() / (std::string(name) + "_" + std::to_string(i) + ".rgb"));
      const Diff d = compare(rows.data(), rows.size(), want);
      EXPECT_EQ(d.max, 0) << name << " case " << i << ": " << c.w << "x" << c.h << " at " << c.size << ", "
                          << d.differing << " of " << d.total << " values differ";
    }
  }
}

// InternVL's dynamic_preprocess (tests/reference/internvl_tiles.py, from InternVL's code with
// Pillow): the grid chosen on 4000 sizes, and on 60 crops of real images (strips among them;
// tiles of 448 px and smaller, 1 to 40 of them, with and without the thumbnail) the tiles'
// pixels, thumbnail last, as prepare_image stacks them.
const fs::path& tiles_reference() {
  static const Removed made{pillow_fixture("internvl_tiles.py")};
  return made.dir;
}

ImageGeometry tiling(int size, int lo, int hi, bool thumbnail) {
  ImageGeometry g;
  g.patch = 14, g.merge = 2, g.resize = ImageFit::siglip, g.image_size = size;
  g.min_tiles = lo, g.max_tiles = hi, g.thumbnail = thumbnail;
  return g;
}

TEST(InternVlTiling, TheGridIsInternVlsOnEverySize) {
  int64_t n = 0, multi = 0;
  for (const auto& c : nlohmann::json::parse(testing::read_text(tiles_reference() / "grids.json"))) {
    const TileGrid t = tile_grid(c["h"], c["w"], tiling(c["size"], c["min"], c["max"], true));
    EXPECT_EQ(t.cols, c["grid"][0].get<int>()) << c.dump();
    EXPECT_EQ(t.rows, c["grid"][1].get<int>()) << c.dump();
    ++n, multi += t.cols * t.rows > 1;
  }
  EXPECT_GE(n, 4000);
  EXPECT_GE(multi, 2000);
}

TEST(InternVlTiling, TilesArePillowsOnRealImages) {
  const auto all = nlohmann::json::parse(testing::read_text(tiles_reference() / "cases.json"));
  ASSERT_GE(all.size(), 50u);
  int64_t tiles = 0, with_thumbnail = 0, dropped_differs = 0;
  int worst = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& c = all[i];
    const int S = c["size"];
    const std::vector<uint8_t> png = read_image_file((tiles_reference() / ("src_" + std::to_string(i) + ".png")).string());
    const cv::Mat bgr = decode_image(png.data(), png.size(), "src");
    ASSERT_EQ(bgr.cols, c["w"].get<int>());
    const ImageGeometry g = tiling(S, c["min"], c["max"], c["thumbnail"]);
    const TileGrid t = tile_grid(bgr.rows, bgr.cols, g);
    EXPECT_EQ(t.cols, c["grid"][0].get<int>()) << i;
    EXPECT_EQ(t.rows, c["grid"][1].get<int>()) << i;
    ASSERT_EQ(t.count(), c["tiles"].get<int>()) << i;
    const PreparedImage p = prepare_image(bgr, g);
    ASSERT_EQ(p.tiles, t.count());
    ASSERT_EQ(p.grid_h, t.count() * S / 14);
    ASSERT_EQ(p.grid_w, S / 14);
    EXPECT_EQ(image_grid(bgr.rows, bgr.cols, g).tokens(), p.n_patches() / 4) << "the header's count is the tiles'";
    // The stacked patches back into rows: tile after tile, each S rows.
    const int H = p.grid_h * 14;
    std::vector<uint8_t> rows(size_t(H) * size_t(S) * 3);
    for (int y = 0; y < H; ++y)
      for (int x = 0; x < S; ++x)
        for (int ch = 0; ch < 3; ++ch)
          rows[(size_t(y) * size_t(S) + size_t(x)) * 3 + size_t(ch)] =
              p.pixels[size_t(((y / 14) * p.grid_w + x / 14) * g.patch_numel() + ((y % 14) * 14 + x % 14) * 3 + ch)];
    const std::string want = testing::read_text(tiles_reference() / ("tiles_" + std::to_string(i) + ".rgb"));
    const Diff d = compare(rows.data(), rows.size(), want);
    EXPECT_LE(d.max, 1) << "case " << i << ": " << c.dump() << ", " << d.differing << " of " << d.total
                        << " values differ";
    tiles += t.count(), with_thumbnail += t.thumbnail, worst = std::max(worst, d.max);
    // The negative control: without the thumbnail a multi-tile image is another tile list.
    if (t.thumbnail) dropped_differs += prepare_image(bgr, tiling(S, c["min"], c["max"], false)).pixels.size() != want.size();
  }
  EXPECT_GE(with_thumbnail, 20);
  EXPECT_EQ(dropped_differs, with_thumbnail);
  std::printf("%zu crops, %lld tiles (%lld thumbnails): largest difference from InternVL's %d grey levels\n",
              all.size(), static_cast<long long>(tiles), static_cast<long long>(with_thumbnail), worst);
}

// WebP (lossless, lossy, extended) is read, its size from its own header; an animated WebP and a
// GIF are refused with a message that says what to do.
TEST(ImageFormats, WebPIsReadAndGifAndAnimationsAreRefusedClearly) {
  const fs::path d = reference();
  const ImageSize png = read_image_size((d / "fmt_src.png").string());
  ASSERT_EQ(png.w, 123);
  ASSERT_EQ(png.h, 77);
  ImageGeometry g;
  g.patch = 7, g.merge = 1, g.min_pixels = 49, g.max_pixels = 1 << 20;
  const PreparedImage want = load_image((d / "fmt_src.png").string(), g, 0);
  for (const char* name : {"fmt_lossless.webp", "fmt_lossy.webp", "fmt_extended.webp"}) {
    const std::string path = (d / name).string();
    const ImageSize s = read_image_size(path);
    EXPECT_EQ(s.w, 123) << name;
    EXPECT_EQ(s.h, 77) << name;
    const PreparedImage got = load_image(path, g, 0);
    ASSERT_EQ(got.pixels.size(), want.pixels.size()) << name;
    int worst = 0;
    for (size_t i = 0; i < got.pixels.size(); ++i) worst = std::max(worst, std::abs(int(got.pixels[i]) - int(want.pixels[i])));
    if (std::string(name) != "fmt_lossy.webp") EXPECT_EQ(worst, 0) << name << ": lossless must decode to the PNG's pixels";
    else EXPECT_LT(worst, 128) << name;
  }
  const auto refusal = [](const fs::path& p) {
    try {
      read_image_size(p.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string gif = refusal(d / "fmt.gif"), anim = refusal(d / "fmt_anim.webp");
  EXPECT_NE(gif.find("is a GIF, which dhp does not read"), std::string::npos) << gif;
  EXPECT_NE(gif.find("as PNG"), std::string::npos) << gif;
  EXPECT_NE(anim.find("is an animated WebP"), std::string::npos) << anim;
  // Cut short: refused by the RIFF size, before the decoder.
  const std::vector<uint8_t> full = read_image_file((d / "fmt_lossless.webp").string());
  try {
    decode_image(full.data(), full.size() - 10, "cut.webp");
    ADD_FAILURE() << "a truncated WebP must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is truncated (WebP"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dhp
