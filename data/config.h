// [data] section: where samples come from and how they are cut into sequences.
#pragma once

#include <cstdint>
#include <string>

#include "data/manifest.h"

namespace dhp {

// Most decode threads a data loader or a build may start: beyond the cores of any machine
// this runs on, and few enough that a mistyped count cannot exhaust threads and memory.
inline constexpr int kMaxDataWorkers = 256;

struct DataConfig {
  std::string train = "data/demo/train.jsonl";  // JSONL manifest, or a `dhp data build` folder
  std::string val = "data/demo/val.jsonl";          // held-out manifest ("" = none)
  std::string image_root;                           // "" = the manifest's own folder
  std::string tokenizer = "data/demo/tokenizer.model";
  int64_t max_tokens = 4096;       // a sample longer than this is skipped and reported
  int64_t max_image_pixels = kDefaultMaxImagePixels;  // an image with more (H*W) is skipped
  int workers = 1;                 // background decode threads
  std::string on_error = "skip";   // "skip" | "fail"
  // The share of a data set's records a run may skip when it opens it (bad lines, images that
  // do not load); more stops the run, naming the reasons: a wrong image folder or another
  // tool's format would otherwise train on what is left and exit 0.
  double max_skipped = 0.05;
  bool allow_absolute_paths = false;  // image paths may be absolute (else confined to the root)
  ChatTemplate chat_template = ChatTemplate::Dhp;  // data.template: how turns are laid out
  std::string added_tokens = "auto";  // "auto" | "none" | "<image>,<pad>": data/tokenizer.h
  VideoRules video;                // video_fps, min_frames, max_frames, video_max_pixels
};

}  // namespace dhp
