// `dhp data synth --preset NAME`: image data sets whose length distribution follows a preset
// of presets.h. Each sample's image sizes, image count and text lengths come from
// preset_sample(); the pixels and words come from the demo's shapes scenes, so a model can
// still learn from them, and the files exercise the whole pipeline (PNG and JPEG, many images
// per sample, video clips, long texts) at realistic proportions.
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "core/log.h"
#include "data/codecs.h"
#include "data/presets.h"
#include "data/synth.h"
#include "data/synth_scene.h"
#include "data/tokenizer.h"
#include "data/video.h"

namespace dhp {

namespace {

namespace fs = std::filesystem;

constexpr int kMinSide = 32;               // make_scene_of_size needs room for one shape
constexpr double kJpegShare = 0.3;         // of single images
constexpr int kClipFps = 4;                // frames per second of a written clip
constexpr double kMp4Share = 0.25;         // of clips, MPEG-4 in MP4; the rest MJPEG in AVI
constexpr size_t kTokenizerPieces = 20000; // sentences the tokenizer trains on, at most

// Sentences about random scenes until `words` words are reached (the BPE model of this tiny
// grammar maps most words to one token, so words approximate tokens).
std::string filler(Rng& rng, int64_t words, std::vector<std::string>* pieces) {
  std::string out;
  int64_t n = 0;
  while (n < words) {
    Rng scene_rng(rng.next());
    std::string sentence = caption(make_scene_of_size(scene_rng, 144, 144));
    n += std::count(sentence.begin(), sentence.end(), ' ') + 1;
    if (pieces && pieces->size() < kTokenizerPieces) pieces->push_back(sentence);
    if (!out.empty()) out += ' ';
    out += sentence;
  }
  return out;
}

int scaled(int side, double scale) {
  return std::max(kMinSide, int(std::lround(side * scale)));
}

// Writes the clip of `frames` frames of motion m at kClipFps; returns its path under `dir`.
std::string write_clip(const fs::path& dir, const std::string& id, const Motion& m,
                       int64_t frames, bool mp4) {
  const std::string rel = fmt::format("videos/{}{}", id, mp4 ? ".mp4" : ".avi");
  const std::string path = (dir / rel).string();
  const int fourcc = mp4 ? codecs::fourcc('m', 'p', '4', 'v') : codecs::fourcc('M', 'J', 'P', 'G');
  codecs::VideoWriter out(path, cv::CAP_FFMPEG, fourcc, kClipFps, cv::Size(m.w, m.h));
  DHP_CHECK(out.opened(), "cannot write video '{}' ({} with OpenCV's FFmpeg writer)", path,
            mp4 ? "MPEG-4 in MP4" : "MJPEG in AVI");
  for (int64_t f = 0; f < frames; ++f)
    out.write(render_motion(m, frames > 1 ? double(f) / double(frames - 1) : 0.0));
  out.release();
  return rel;
}

std::vector<std::string> write_preset_split(const SynthOptions& opt, const PresetParams& p,
                                            const std::string& split, int64_t n, uint64_t key) {
  const fs::path dir(opt.out_dir);
  const std::string manifest = (dir / (split + ".jsonl")).string();
  std::ofstream out(manifest, std::ios::binary | std::ios::trunc);
  DHP_CHECK(out.good(), "cannot write '{}'", manifest);
  std::vector<std::string> pieces;
  const std::vector<int> png = {cv::IMWRITE_PNG_COMPRESSION, 3};
  const std::vector<int> jpg = {cv::IMWRITE_JPEG_QUALITY, 90};
  for (int64_t i = 0; i < n; ++i) {
    // Train and val draw disjoint preset ids, so they are different samples.
    const int64_t pid = int64_t(key << 40) + i;
    const SyntheticSample ss = preset_sample(p, pid, opt.seed, opt.factor);
    Rng rng(mix_seed(opt.seed, uint64_t(pid)));
    const std::string id = fmt::format("{}-{:06d}", split, i);
    const size_t n_img = ss.images.size();
    // Equal frames of a preset's video kind; multi-image samples draw every size anew.
    const bool video = n_img >= 2 && std::all_of(ss.images.begin(), ss.images.end(), [&](auto& im) {
      return im.height == ss.images[0].height && im.width == ss.images[0].width;
    });
    std::vector<std::string> rels;
    std::string first_caption, clip;
    if (video) {
      // A real clip of n_img seconds, so data.video_fps = 1 samples the preset's frame count
      // (up to data.max_frames). Even sides: the MPEG-4 encoder needs them.
      const int h = scaled(ss.images[0].height, opt.scale) & ~1;
      const int w = scaled(ss.images[0].width, opt.scale) & ~1;
      const Motion m = make_motion(rng, h, w);
      first_caption = motion_caption(m);
      clip = write_clip(dir, id, m, int64_t(n_img) * kClipFps, rng.uniform() < kMp4Share);
    }
    for (size_t k = 0; k < n_img && !video; ++k) {
      const int h = scaled(ss.images[k].height, opt.scale);
      const int w = scaled(ss.images[k].width, opt.scale);
      const Scene scene = make_scene_of_size(rng, h, w);
      if (k == 0) first_caption = caption(scene);
      // No noise: it would make big PNGs that say nothing more about the pipeline.
      const cv::Mat img = render(scene, rng, false);
      const bool as_jpeg = rng.uniform() < kJpegShare;
      const std::string rel = fmt::format("images/{}-{}{}", id, k, as_jpeg ? ".jpg" : ".png");
      const std::string path = (dir / rel).string();
      DHP_CHECK(codecs::write_image(path, img, as_jpeg ? jpg : png), "cannot write image '{}'", path);
      rels.push_back(rel);
    }
    const int64_t answer_words = std::max<int64_t>(1, ss.loss_tokens - 1);
    // A clip's frames each carry a timestamp (about two tokens) besides <img> </img>.
    const int64_t prompt_words = std::max<int64_t>(
        0, ss.text_tokens - 2 - (video ? 4 : 2) * int64_t(n_img) - answer_words);
    std::string human = video ? "<video>" : "";
    for (size_t k = 0; k < rels.size(); ++k) human += "<image>";
    const std::string ask = n_img == 0 ? "Continue the story."
                            : video    ? "Describe the video."
                                       : kPrompts[rng.below(kPrompts.size())];
    if (!human.empty()) human += '\n';
    human += ask;
    if (prompt_words > 4) {
      human += ' ';  // appended separately: `" " + string` trips a GCC 12 -Wrestrict false positive
      human += filler(rng, prompt_words - 4, &pieces);
    }
    std::string answer = first_caption;
    const int64_t have = answer.empty() ? 0 : std::count(answer.begin(), answer.end(), ' ') + 1;
    if (have < answer_words) {
      if (!answer.empty()) answer += ' ';
      answer += filler(rng, answer_words - have, &pieces);
    }
    if (pieces.size() < kTokenizerPieces) pieces.push_back(ask), pieces.push_back(first_caption);

    nlohmann::ordered_json j;
    j["id"] = id;
    if (rels.size() == 1) j["image"] = rels[0];
    if (rels.size() > 1) j["images"] = rels;
    if (video) j["video"] = clip;
    j["conversations"] = {{{"from", "human"}, {"value", human}},
                          {{"from", "gpt"}, {"value", answer}}};
    out << j.dump() << '\n';
  }
  DHP_CHECK(out.good(), "cannot write '{}'", manifest);
  return pieces;
}

}  // namespace

void synthesize_preset(const SynthOptions& opt) {
  DHP_CHECK(opt.train > 0 && opt.val >= 0, "synth: need train > 0 and val >= 0 samples");
  DHP_CHECK(opt.scale > 0 && opt.scale <= 4, "synth: --scale must be in (0, 4], got {}", opt.scale);
  DHP_CHECK(opt.factor >= 1, "synth: --factor must be >= 1");
  PresetParams p;
  try {
    p = preset_params(opt.preset);
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  std::error_code ec;
  fs::create_directories(fs::path(opt.out_dir) / "images", ec);
  if (!ec) fs::create_directories(fs::path(opt.out_dir) / "videos", ec);
  DHP_CHECK(!ec, "cannot create '{}': {}", opt.out_dir, ec.message());
  std::vector<std::string> texts = write_preset_split(opt, p, "train", opt.train, 1);
  write_preset_split(opt, p, "val", opt.val, 2);
  texts.push_back(grammar_words());
  texts.push_back("Continue the story. Describe the video. moves from to the center");
  // Frame timestamps (data/video.h), so they tokenize to digits rather than <unk>.
  std::string stamps;
  for (int t = 0; t < 600; t += 7) stamps += frame_timestamp(t * 0.5) + " ";
  texts.push_back(stamps);
  train_tokenizer(texts, opt.vocab_size, (fs::path(opt.out_dir) / "tokenizer.model").string());
  spdlog::info("synth: wrote {} train and {} val samples of preset '{}' to {}", opt.train,
               opt.val, opt.preset, opt.out_dir);
}

}  // namespace dhp
