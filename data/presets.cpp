#include "data/presets.h"

#include "types/image_geometry.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dhp {
namespace {

// Counter-based generator: every sample gets its own stream from (seed, id), and only
// integer arithmetic and <cmath> are used, never std:: distributions, whose output differs
// between standard libraries.
class Stream {
 public:
  Stream(uint64_t seed, int64_t id) : state_(mix(seed ^ mix(uint64_t(id) + 0x9e3779b97f4a7c15ULL))) {}
  uint64_t next() { return mix(state_ += 0x9e3779b97f4a7c15ULL); }
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {
    double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
  double lognormal(double median, double sigma) { return median * std::exp(sigma * normal()); }
  int64_t range(int64_t lo, int64_t hi) { return lo + int64_t(next() % uint64_t(hi - lo + 1)); }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

// An image whose short side is about `side` pixels, snapped to multiples of f and capped at
// max_tokens decoder tokens by shrinking both sides (what a max_pixels limit does).
SyntheticImage make_image(Stream& rng, double side, int f, int64_t max_tokens) {
  double aspect = std::exp(0.35 * rng.normal());  // width / height
  double h = aspect >= 1 ? side : side / aspect, w = aspect >= 1 ? side * aspect : side;
  int64_t gh = std::max<int64_t>(1, std::llround(h / f)), gw = std::max<int64_t>(1, std::llround(w / f));
  while (gh * gw > max_tokens) {
    double s = std::sqrt(double(max_tokens) / double(gh * gw));
    gh = std::max<int64_t>(1, int64_t(gh * s)), gw = std::max<int64_t>(1, int64_t(gw * s));
  }
  return SyntheticImage{int(gh * f), int(gw * f), gh * gw};
}

// A tiled image (PresetParams::tile_side): its own size about `side` on the short side, the
// aspect ratio spread widely, cut as InternVL cuts it into at most max_tiles tiles.
SyntheticImage make_tiled(Stream& rng, double side, const PresetParams& p, int max_tiles, int f) {
  const double aspect = std::exp(0.6 * rng.normal());  // width / height
  const int h = std::max(1, int(std::lround(aspect >= 1 ? side : side / aspect)));
  const int w = std::max(1, int(std::lround(aspect >= 1 ? side * aspect : side)));
  ImageGeometry g;
  g.image_size = p.tile_side;
  g.min_tiles = 1, g.max_tiles = max_tiles, g.thumbnail = true;
  const int tiles = tile_grid(h, w, g).count();
  const int64_t per = int64_t(p.tile_side / f) * (p.tile_side / f);
  return SyntheticImage{h, w, tiles * per, tiles};
}

int64_t text_len(Stream& rng, double median, double sigma, int64_t lo) {
  return std::max<int64_t>(lo, std::llround(rng.lognormal(median, sigma)));
}

}  // namespace

std::vector<std::string> preset_names() { return {"captions", "mixed", "video-longtail", "internvl-tiles"}; }

PresetParams preset_params(const std::string& name) {
  PresetParams p;
  p.name = name;
  if (name == "captions") {
    p.caption_weight = 0.9, p.multi_image_weight = 0.05, p.text_weight = 0.05;
    p.max_images = 3, p.max_tokens = 8192;
  } else if (name == "mixed") {
    p.caption_weight = 0.5, p.document_weight = 0.2, p.multi_image_weight = 0.15;
    p.text_weight = 0.1, p.video_weight = 0.05;
    p.min_frames = 4, p.max_frames = 32, p.video_alpha = 2.0, p.max_tokens = 16384;
  } else if (name == "video-longtail") {
    // Median ~300 tokens; ~10% video with a Pareto(1.1) frame count reaching 512 frames of
    // ~150 tokens, so the longest samples are 100x the median and carry most of the work.
    p.caption_weight = 0.75, p.document_weight = 0.1, p.multi_image_weight = 0.05;
    p.video_weight = 0.1, p.min_frames = 8, p.max_frames = 512, p.video_alpha = 1.1;
    p.max_tokens = 65536;
  } else if (name == "internvl-tiles") {
    // InternVL3's supervised mixture as its tiling sees it: photos (a few tiles), documents and
    // charts (up to 12 tiles and the thumbnail), multi-image samples sharing the 12 tiles, a
    // little text; InternVL3's 16k-token sequences.
    p.caption_weight = 0.55, p.document_weight = 0.25, p.multi_image_weight = 0.1, p.text_weight = 0.1;
    p.caption_side = 500, p.document_side = 1200, p.max_images = 4;
    p.tile_side = 448, p.max_tiles = 12, p.max_tokens = 16384;
  } else {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown length preset '" + name + "' (known: " + known + ")");
  }
  return p;
}

SyntheticSample preset_sample(const PresetParams& p, int64_t id, uint64_t seed, int factor) {
  if (factor < 1) throw std::invalid_argument("preset_sample: factor must be >= 1");
  Stream rng(seed, id);
  SyntheticSample s;
  s.id = id;
  const double weights[5] = {p.caption_weight, p.document_weight, p.multi_image_weight,
                             p.video_weight, p.text_weight};
  double total = 0;
  for (double w : weights) total += std::max(0.0, w);
  if (total <= 0) throw std::invalid_argument("preset '" + p.name + "' has no positive weight");
  double pick = rng.uniform() * total;
  int kind = 0;
  while (kind < 4 && pick >= std::max(0.0, weights[kind])) pick -= std::max(0.0, weights[kind++]);

  int64_t answer = 0, prompt = 0;
  // An image of the preset: tiled as InternVL cuts it, or resized within max_image_tokens.
  auto image = [&](double side, int tiles) {
    return p.tile_side > 0 ? make_tiled(rng, side, p, tiles, factor) : make_image(rng, side, factor, p.max_image_tokens);
  };
  switch (kind) {
    case 0:  // caption
      s.images.push_back(image(rng.lognormal(p.caption_side, 0.25), p.max_tiles));
      answer = text_len(rng, 30, 0.6, 3), prompt = text_len(rng, 8, 0.5, 1);
      break;
    case 1:  // document / chart
      s.images.push_back(image(rng.lognormal(p.document_side, 0.3), p.max_tiles));
      answer = text_len(rng, 120, 0.9, 3), prompt = text_len(rng, 40, 0.6, 4);
      break;
    case 2: {  // several images
      int64_t n = rng.range(2, std::max(2, p.max_images));
      for (int64_t i = 0; i < n; ++i)
        s.images.push_back(image(rng.lognormal(p.caption_side, 0.25), std::max(1, p.max_tiles / int(n))));
      answer = text_len(rng, 60, 0.7, 3), prompt = text_len(rng, 30, 0.6, 4);
      break;
    }
    case 3: {  // video: equal frames, Pareto count
      double u = 1.0 - rng.uniform();
      int64_t frames = std::min<int64_t>(p.max_frames, int64_t(p.min_frames * std::pow(u, -1.0 / p.video_alpha)));
      SyntheticImage frame = make_image(rng, rng.lognormal(280, 0.15), factor, p.max_image_tokens);
      s.images.assign(size_t(std::max<int64_t>(1, frames)), frame);
      answer = text_len(rng, 80, 0.8, 3), prompt = text_len(rng, 20, 0.5, 2);
      break;
    }
    default:  // text only
      answer = text_len(rng, 500, 0.8, 8), prompt = text_len(rng, 300, 0.8, 4);
      break;
  }
  // Markers: <bos> <eos> and <img> </img> around every image.
  auto vision = [&] {
    int64_t v = 0;
    for (const auto& im : s.images) v += im.tokens;
    return v;
  };
  // Over-long samples drop trailing images first, then shorten the text, as a builder would.
  while (s.images.size() > 1 && vision() + prompt + answer + 2 + 2 * int64_t(s.images.size()) > p.max_tokens)
    s.images.pop_back();
  s.vision_tokens = vision();
  int64_t room = p.max_tokens - s.vision_tokens - 2 - 2 * int64_t(s.images.size());
  if (prompt + answer > room) {
    answer = std::max<int64_t>(1, std::min(answer, room / 2));
    prompt = std::max<int64_t>(0, room - answer);
  }
  s.text_tokens = prompt + answer + 2 + 2 * int64_t(s.images.size());
  s.loss_tokens = answer + 1;  // the answer and its <eos>
  return s;
}

std::vector<SyntheticSample> preset_samples(const PresetParams& p, int64_t first_id, int64_t count,
                                            uint64_t seed, int factor) {
  std::vector<SyntheticSample> out;
  out.reserve(size_t(std::max<int64_t>(0, count)));
  for (int64_t i = 0; i < count; ++i) out.push_back(preset_sample(p, first_id + i, seed, factor));
  return out;
}

}  // namespace dhp
