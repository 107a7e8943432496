// [data] section: where samples come from and how they are cut into sequences.
#pragma once

#include <cstdint>
#include <string>

namespace dhp {

struct DataConfig {
  std::string train = "data/demo/train.jsonl";      // LLaVA-style JSONL manifest
  std::string val = "data/demo/val.jsonl";          // held-out manifest ("" = none)
  std::string image_root;                           // "" = the manifest's own folder
  std::string tokenizer = "data/demo/tokenizer.model";
  int64_t max_tokens = 4096;       // a sample longer than this is skipped and reported
  int workers = 1;                 // background decode threads
  std::string on_error = "skip";   // "skip" | "fail"
};

}  // namespace dhp
