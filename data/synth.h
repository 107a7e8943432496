// A synthetic captioning dataset small enough to learn on a laptop: images of 1-3 coloured
// shapes on a light background, captioned from what was drawn (count, colour, shape,
// position), in a regular grammar with a few dozen words.
//
// With a length preset (presets.h: "captions", "mixed", "video-longtail") the same scenes
// are drawn at the sizes and counts the preset gives each sample: low- and high-resolution
// single images, multi-image samples, real video clips (MJPEG/AVI and MPEG-4/MP4, written
// with OpenCV's VideoWriter: one shape crossing the frame, captioned with what moves where)
// and long text-only documents, with the preset's long tail of lengths.
#pragma once

#include <cstdint>
#include <string>

namespace dhp {

struct SynthOptions {
  std::string out_dir = "data/demo";
  int64_t train = 2000;
  int64_t val = 200;
  uint64_t seed = 7;
  int vocab_size = 160;  // upper bound for the tokenizer trained on the captions and prompts
  int min_side = 32;     // image sides are drawn independently from [min_side, max_side]
  int max_side = 192;
  std::string preset;    // "" = the demo set above; else a length preset
  double scale = 1.0;    // preset image sides are multiplied by this (>= 32 pixels)
  int factor = 28;       // patch * merge the preset's sizes are snapped to (presets.h)
  bool force = false;    // write into a folder that is not empty (else refused)
};

// Writes out_dir/{train,val}.jsonl, out_dir/images/*.png|*.jpg, out_dir/videos/*.avi|*.mp4 (presets
// with video) and out_dir/tokenizer.model.
// The same options give byte-identical files. An out_dir that is not empty is refused unless
// opt.force: replacing a data set's tokenizer would orphan every checkpoint trained on it.
void synthesize(const SynthOptions& opt);
// The preset branch of synthesize(): `train` and `val` samples of opt.preset.
void synthesize_preset(const SynthOptions& opt);

}  // namespace dhp
