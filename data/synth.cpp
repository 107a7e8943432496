#include "data/synth.h"

#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/input.h"

#include "core/check.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/codecs.h"
#include "data/synth_scene.h"
#include "data/tokenizer.h"

namespace dhp {

namespace fs = std::filesystem;

namespace {

struct Colour {
  const char* name;
  cv::Scalar bgr;
};
// Far apart in hue and brightness, so a few patches suffice to tell them apart.
const std::array<Colour, 6> kColours = {{{"red", {0, 0, 230}},
                                         {"green", {0, 170, 0}},
                                         {"blue", {230, 60, 0}},
                                         {"yellow", {0, 215, 235}},
                                         {"purple", {170, 0, 150}},
                                         {"black", {20, 20, 20}}}};
const std::array<const char*, 3> kShapes = {"circle", "square", "triangle"};
const std::array<const char*, 4> kCounts = {"", "a", "two", "three"};

}  // namespace

const std::array<const char*, 3> kPrompts = {"Describe the image.", "What is in the picture?",
                                             "Describe what you see."};

namespace {

constexpr int kCellSide = 48;   // a cell per 48 px of side, at most 3 x 3, so shapes fit
constexpr int kMinShape = 14;   // one vision patch: smaller shapes would be hard to see
constexpr int kMargin = 4;      // pixels kept free around each shape inside its cell
constexpr double kJpegShare = 0.3;
constexpr int kNoise = 10;      // amplitude of the "lightly noisy" background

// Where a cell is, in words; an axis with one cell says nothing about that direction.
std::string position(int row, int rows, int col, int cols) {
  std::string v, hz;
  if (rows == 3) v = std::array<const char*, 3>{"top", "middle", "bottom"}[row];
  if (rows == 2) v = row == 0 ? "top" : "bottom";
  if (cols == 3) hz = std::array<const char*, 3>{"left", "center", "right"}[col];
  if (cols == 2) hz = col == 0 ? "left" : "right";
  if (v == "middle") v.clear();
  if (hz == "center") hz.clear();
  if (v.empty() && hz.empty()) return "in the center";
  if (v.empty()) return "on the " + hz;
  if (hz.empty()) return "at the " + v;
  return "at the " + v + " " + hz;
}

}  // namespace

std::string caption(const Scene& s) {
  std::string out;
  for (size_t i = 0; i < s.groups.size(); ++i) {
    const Group& g = s.groups[i];
    if (i > 0) out += i + 1 == s.groups.size() ? " and " : ", ";
    out += std::string(kCounts[g.count]) + " " + kColours[g.colour].name + " " +
           kShapes[g.shape] + (g.count > 1 ? "s " : " ") +
           position(g.row, s.rows, g.col, s.cols);
  }
  return out + ".";
}

namespace {

struct CellBox {
  int y0, x0, h, w;
};
CellBox cell_box(const Scene& s, int row, int col) {
  const int y0 = row * s.h / s.rows, y1 = (row + 1) * s.h / s.rows;
  const int x0 = col * s.w / s.cols, x1 = (col + 1) * s.w / s.cols;
  return {y0, x0, y1 - y0, x1 - x0};
}

// Largest shape side when `count` shapes share the cell along its longer side.
int max_shape(const CellBox& c, int count) {
  const bool across = c.w >= c.h;
  const int sub_h = across ? c.h : c.h / count, sub_w = across ? c.w / count : c.w;
  return std::min(sub_h, sub_w) - 2 * kMargin;
}

}  // namespace

Scene make_scene(Rng& rng, int min_side, int max_side) {
  const int h = int(rng.range(min_side, max_side));
  const int w = int(rng.range(min_side, max_side));
  return make_scene_of_size(rng, h, w);
}

Scene make_scene_of_size(Rng& rng, int h, int w) {
  Scene s;
  s.h = h;
  s.w = w;
  s.rows = std::clamp(s.h / kCellSide, 1, 3);
  s.cols = std::clamp(s.w / kCellSide, 1, 3);
  const int cells = s.rows * s.cols;
  const int n_groups = int(rng.range(1, std::min(3, cells)));
  std::vector<int> cell(static_cast<size_t>(cells));  // partial Fisher-Yates picks distinct cells
  for (int i = 0; i < cells; ++i) cell[size_t(i)] = i;
  for (int i = 0; i < n_groups; ++i)
    std::swap(cell[size_t(i)], cell[size_t(rng.range(i, cells - 1))]);
  // At most three shapes in all: the extra ones go to a single group.
  const int extra = int(rng.range(0, 3 - n_groups));
  const int extra_to = int(rng.range(0, n_groups - 1));
  for (int i = 0; i < n_groups; ++i) {
    Group g;
    g.colour = int(rng.below(kColours.size()));
    g.shape = int(rng.below(kShapes.size()));
    g.row = cell[size_t(i)] / s.cols;
    g.col = cell[size_t(i)] % s.cols;
    g.count = 1 + (i == extra_to ? extra : 0);
    while (g.count > 1 && max_shape(cell_box(s, g.row, g.col), g.count) < kMinShape) --g.count;
    s.groups.push_back(g);
  }
  std::sort(s.groups.begin(), s.groups.end(), [](const Group& a, const Group& b) {
    return a.row != b.row ? a.row < b.row : a.col < b.col;
  });
  return s;
}

namespace {

void draw_shape(cv::Mat& img, int shape, int cy, int cx, int side, const cv::Scalar& c) {
  const int r = side / 2;
  if (shape == 0) {
    cv::circle(img, {cx, cy}, r, c, cv::FILLED, cv::LINE_AA);
  } else if (shape == 1) {
    cv::rectangle(img, cv::Point(cx - r, cy - r), cv::Point(cx - r + side - 1, cy - r + side - 1),
                  c, cv::FILLED);
  } else {
    const std::vector<cv::Point> tri = {{cx, cy - r}, {cx - r, cy + r}, {cx + r, cy + r}};
    cv::fillConvexPoly(img, tri, c, cv::LINE_AA);
  }
}

}  // namespace

cv::Mat render(const Scene& s, Rng& rng, bool allow_noise) {
  const cv::Scalar bg(double(rng.range(215, 255)), double(rng.range(215, 255)),
                      double(rng.range(215, 255)));
  cv::Mat img(s.h, s.w, CV_8UC3, bg);
  if (rng.below(2) == 1 && allow_noise) {
    for (int y = 0; y < s.h; ++y) {
      uint8_t* row = img.ptr<uint8_t>(y);
      for (int x = 0; x < s.w * 3; ++x)
        row[x] = cv::saturate_cast<uint8_t>(int(row[x]) + int(rng.range(-kNoise, kNoise)));
    }
  }
  for (const Group& g : s.groups) {
    const CellBox c = cell_box(s, g.row, g.col);
    const int top = max_shape(c, g.count);
    // Sizes vary from a little over half of the room to all of it, never below one patch.
    const int side = int(rng.range(std::max(kMinShape, top / 2 + 1), std::max(kMinShape, top)));
    const bool across = c.w >= c.h;
    for (int k = 0; k < g.count; ++k) {
      // Each shape sits in its share of the cell, jittered within the slack.
      const int sub_h = across ? c.h : c.h / g.count, sub_w = across ? c.w / g.count : c.w;
      const int sy = c.y0 + (across ? 0 : k * sub_h), sx = c.x0 + (across ? k * sub_w : 0);
      const int slack_y = std::max(0, sub_h - side - 2 * kMargin);
      const int slack_x = std::max(0, sub_w - side - 2 * kMargin);
      const int cy = sy + kMargin + int(rng.range(0, slack_y)) + side / 2;
      const int cx = sx + kMargin + int(rng.range(0, slack_x)) + side / 2;
      draw_shape(img, g.shape, cy, cx, side, kColours[g.colour].bgr);
    }
  }
  return img;
}

Motion make_motion(Rng& rng, int h, int w) {
  Motion m;
  m.h = h;
  m.w = w;
  m.colour = int(rng.below(kColours.size()));
  m.shape = int(rng.below(kShapes.size()));
  m.side = std::max(kMinShape, std::min(h, w) / 4);
  const int from = int(rng.below(9));
  const int to = (from + 1 + int(rng.below(8))) % 9;  // any other cell
  m.from_row = from / 3, m.from_col = from % 3, m.to_row = to / 3, m.to_col = to % 3;
  m.background = cv::Scalar(double(rng.range(215, 255)), double(rng.range(215, 255)),
                            double(rng.range(215, 255)));
  return m;
}

cv::Mat render_motion(const Motion& m, double t) {
  cv::Mat img(m.h, m.w, CV_8UC3, m.background);
  // Cell centres, kept far enough from the border that the whole shape shows.
  auto centre = [&](int i, int n) {
    const int lo = m.side / 2 + 1, hi = n - m.side / 2 - 2;
    return lo + (hi - lo) * i / 2;
  };
  const double y0 = centre(m.from_row, m.h), x0 = centre(m.from_col, m.w);
  const double y1 = centre(m.to_row, m.h), x1 = centre(m.to_col, m.w);
  draw_shape(img, m.shape, int(std::lround(y0 + (y1 - y0) * t)),
             int(std::lround(x0 + (x1 - x0) * t)), m.side, kColours[m.colour].bgr);
  return img;
}

std::string motion_caption(const Motion& m) {
  // position() says "at the top left" / "on the right" / "in the center"; the motion reads
  // "from the top left to the right".
  auto place = [](int row, int col) {
    const std::string p = position(row, 3, col, 3);
    return p == "in the center" ? std::string("the center") : p.substr(p.find(' ') + 1);
  };
  return fmt::format("a {} {} moves from {} to {}.", kColours[m.colour].name, kShapes[m.shape],
                     place(m.from_row, m.from_col), place(m.to_row, m.to_col));
}

std::string grammar_words() {
  std::string words = "a two three at on in the top bottom left right center and";
  for (const auto& c : kColours) words += std::string(" ") + c.name;
  for (const char* s : kShapes) words += fmt::format(" {} {}s", s, s);
  return words;
}

namespace {

// Writes one split; returns its prompts and captions (the tokenizer's training text).
std::vector<std::string> write_split(const SynthOptions& opt, const std::string& split,
                                     int64_t n, uint64_t key) {
  const fs::path dir(opt.out_dir);
  const std::string manifest = (dir / (split + ".jsonl")).string();
  std::ofstream out(manifest, std::ios::binary | std::ios::trunc);
  DHP_CHECK(out.good(), "cannot write '{}'", manifest);
  std::vector<std::string> texts;
  const std::vector<int> png = {cv::IMWRITE_PNG_COMPRESSION, 3};
  const std::vector<int> jpg = {cv::IMWRITE_JPEG_QUALITY, 92};
  for (int64_t i = 0; i < n; ++i) {
    Rng rng(mix_seed(opt.seed, (key << 40) + uint64_t(i)));
    const Scene scene = make_scene(rng, opt.min_side, opt.max_side);
    const cv::Mat img = render(scene, rng, true);
    const bool as_jpeg = rng.uniform() < kJpegShare;
    const std::string id = fmt::format("{}-{:06d}", split, i);
    const std::string rel = "images/" + id + (as_jpeg ? ".jpg" : ".png");
    const std::string path = (dir / rel).string();
    DHP_CHECK(codecs::write_image(path, img, as_jpeg ? jpg : png), "cannot write image '{}'", path);
    const std::string prompt = kPrompts[rng.below(kPrompts.size())];
    const std::string cap = caption(scene);
    texts.push_back(prompt);
    texts.push_back(cap);
    nlohmann::ordered_json j;
    j["id"] = id;
    j["image"] = rel;
    j["conversations"] = {{{"from", "human"}, {"value", "<image>\n" + prompt}},
                          {{"from", "gpt"}, {"value", cap}}};
    out << j.dump() << '\n';
  }
  DHP_CHECK(out.good(), "cannot write '{}'", manifest);
  return texts;
}

}  // namespace

void synthesize(const SynthOptions& opt) {
  std::error_code ec;
  const auto st = fs::symlink_status(opt.out_dir, ec);
  if (fs::exists(st)) {
    DHP_CHECK(fs::is_directory(fs::status(opt.out_dir, ec)), "--out '{}' exists and is not a folder",
              printable(opt.out_dir));
    DHP_CHECK(opt.force || fs::is_empty(opt.out_dir, ec),
              "--out '{}' is not empty: choose an empty --out, or pass --force to write a data "
              "set over its files (its tokenizer.model and manifests are replaced)",
              printable(opt.out_dir));
  }
  if (!opt.preset.empty()) return synthesize_preset(opt);
  DHP_CHECK(opt.train > 0 && opt.val >= 0, "synth: need train > 0 and val >= 0 samples");
  DHP_CHECK(opt.min_side >= 32 && opt.min_side <= opt.max_side && opt.max_side <= 4096,
            "synth: need 32 <= min_side <= max_side <= 4096 (got {} and {})", opt.min_side,
            opt.max_side);
  fs::create_directories(fs::path(opt.out_dir) / "images", ec);
  DHP_CHECK(!ec, "cannot create '{}': {}", opt.out_dir, ec.message());

  std::vector<std::string> texts = write_split(opt, "train", opt.train, 1);
  write_split(opt, "val", opt.val, 2);
  // Every word of the grammar once, so a small training split still covers the vocabulary.
  texts.push_back(grammar_words());
  const std::string model = (fs::path(opt.out_dir) / "tokenizer.model").string();
  train_tokenizer(texts, opt.vocab_size, model);
  spdlog::info("synth: wrote {} train and {} val samples, images and {} to {}", opt.train,
               opt.val, "tokenizer.model", opt.out_dir);
}

}  // namespace dhp
