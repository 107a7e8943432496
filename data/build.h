// `dhp data build`: a JSONL manifest and its images and videos -> HDF5 shards + a length index
// (format in shard_format.h). Worker threads check, decode and tokenize lines; a writer
// thread writes each finished shard while the workers go on. Deterministic: a shard ends
// after the first line that brings it to the size bound, so shard boundaries and contents
// depend on the input alone, never on the worker count or timing. Resumable: every shard is
// committed by an atomic rename and records the manifest lines it covers; a rerun on the same
// folder keeps the committed shards and continues with the next line.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "data/manifest.h"
#include "types/image_geometry.h"

namespace dhp {

struct BuildOptions {
  std::string manifest;
  std::string image_root;          // "" = the manifest's folder
  bool allow_absolute_paths = false;  // absolute image paths (else confined to image_root)
  std::string out_dir;
  std::string tokenizer;           // SentencePiece model file (or a folder holding one)
  std::string added_tokens = "auto";  // data.added_tokens (data/tokenizer.h)
  ChatTemplate chat = ChatTemplate::Dhp;  // data.template: recorded, checked when opened
  ImageGeometry vision;             // the resize rule behind the vision-token counts
  int64_t max_tokens = 4096;       // longer samples are skipped ("too long")
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  VideoRules video;                // frame sampling and pixel budget of video entries
  std::string on_error = "skip";   // "skip": count and report; "fail": stop at the first
  int workers = 1;                 // decode / tokenize threads
  int64_t shard_bytes = int64_t(256) << 20;  // a shard closes once it reaches this size
  std::string reencode = "none";   // "none" keeps the bytes as they came | "png" | "jpeg"
  int64_t max_new_shards = -1;     // stop after committing this many shards (-1: no limit);
                                   // a later run continues, as after a kill
  bool progress = true;            // a progress bar on stderr when it is a terminal
};

struct BuildSummary {
  bool complete = false;           // index.h5 written
  int64_t lines = 0;               // manifest lines covered by the shards
  int64_t samples = 0;
  int64_t shards = 0;              // in the folder now
  int64_t resumed_shards = 0;      // found committed from an earlier run
  int64_t processed_lines = 0;     // lines this run checked
  int64_t input_bytes = 0;         // manifest + image bytes this run read
  int64_t image_bytes = 0;         // image bytes in all shards
  int64_t video_frames = 0;        // video frames this run decoded and stored
  std::map<std::string, int64_t> skipped;  // by reason (manifest.h)
  double seconds = 0;
};

BuildSummary build_dataset(const BuildOptions& opt);

// Files of a built folder besides the shards and index.h5.
inline constexpr const char* kBuildKeyFile = "build.json";
inline constexpr const char* kReportFile = "report.txt";

}  // namespace dhp
