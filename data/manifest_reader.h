// The records of a manifest, in either of the two forms LLaVA-style data comes in:
//   - JSONL: one JSON object per line (blank lines are records the parser skips);
//   - one JSON array of objects, as LLaVA's own llava_v1_5_mix665k.json and
//     blip_laion_cc_sbu_558k.json are, pretty-printed or on one line.
// The form is told by the file's first non-blank byte ('[' is an array). An array is read as a
// stream: each element's text is cut out in turn from a buffer of a few MB, so a 665k-record
// file is never held whole. Everything downstream (the data set, `data build`, `data stats`,
// the length index and resume positions) sees records numbered from 1, line numbers in JSONL.
#pragma once

#include <cstdint>
#include <string>

#include "core/input.h"

namespace dhp {

class ManifestReader {
 public:
  // Throws dhp::Error as InputFile does for a missing, special or unreadable file.
  ManifestReader(const std::string& path, const std::string& hint = "",
                 const volatile int* stop = nullptr, int64_t max_record = kMaxLineBytes);
  // The next record's JSON text; false at the end. An array whose structure breaks (an
  // element cut off, a stray byte between elements) or a record longer than max_record is an
  // error naming the file and the record.
  bool next(std::string& record);
  // The number of the record next() returned last: its line in JSONL, its position in an
  // array (from 1).
  int64_t record_no() const { return array_ ? element_ : lines_.line_no(); }
  bool is_array() const { return array_; }
  // "FILE:N" for a line, "FILE record N" for an array element: where a message points.
  std::string where(int64_t record) const;

 private:
  bool fill();  // reads the next chunk of an array file into buf_; false at the end
  std::string path_;
  LineReader lines_;
  bool array_ = false;
  // An array file, read in chunks (its own descriptor, not lines_'s buffering).
  InputFile file_;
  const volatile int* stop_;
  int64_t max_record_;
  std::string buf_;
  size_t pos_ = 0;
  int64_t offset_ = 0, element_ = 0;
  bool eof_ = false, closed_ = false;
};

}  // namespace dhp
