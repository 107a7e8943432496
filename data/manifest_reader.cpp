#include "data/manifest_reader.h"

#include <fmt/format.h>

#include "core/check.h"
#include "core/text.h"

namespace dhp {

namespace {

constexpr size_t kChunk = size_t(1) << 20;

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The first byte of the file that is not blank (after a UTF-8 byte-order mark), or 0.
char first_byte(const InputFile& f) {
  char buf[4096];
  for (int64_t at = 0;;) {
    const int64_t n = f.read_at(buf, int64_t(sizeof buf), at);
    if (n <= 0) return 0;
    int64_t i = 0;
    if (at == 0 && n >= 3 && buf[0] == '\xEF' && buf[1] == '\xBB' && buf[2] == '\xBF') i = 3;
    for (; i < n; ++i)
      if (!blank(buf[i])) return buf[i];
    at += n;
  }
}

}  // namespace

ManifestReader::ManifestReader(const std::string& path, const std::string& hint, const volatile int* stop,
                               int64_t max_record)
    : path_(path),
      lines_("manifest", path, hint, stop, max_record),
      file_("manifest", path, hint),
      stop_(stop),
      max_record_(max_record) {
  array_ = first_byte(file_) == '[';
}

std::string ManifestReader::where(int64_t record) const {
  return array_ ? fmt::format("{} record {}", path_, record) : fmt::format("{}:{}", path_, record);
}

bool ManifestReader::fill() {
  DHP_CHECK(!stop_ || !*stop_, "stopped by a signal while reading manifest '{}' (at record {})",
            printable(path_), element_ + 1);
  if (eof_) return false;
  // Drop what was handed out; keep the element being scanned.
  const int64_t n = append_next_chunk(file_, buf_, pos_, offset_, kChunk);
  pos_ = 0;
  eof_ = n == 0;
  return n > 0;
}

bool ManifestReader::next(std::string& record) {
  if (!array_) return lines_.next(record);
  if (closed_) return false;
  const std::string file = printable(path_);
  // Blanks, then (from the second element on) a comma, then blanks; at the start, the '['.
  auto skip_blanks = [&] {
    for (;;) {
      while (pos_ < buf_.size() && blank(buf_[pos_])) ++pos_;
      if (pos_ < buf_.size() || !fill()) return;
    }
  };
  skip_blanks();
  if (offset_ <= int64_t(kChunk) && element_ == 0 && pos_ < buf_.size() && buf_[pos_] == '\xEF') pos_ += 3;
  skip_blanks();
  if (element_ == 0) {
    DHP_CHECK(pos_ < buf_.size() && buf_[pos_] == '[', "manifest '{}': not a JSON array", file);
    ++pos_;
    skip_blanks();
  }
  DHP_CHECK(pos_ < buf_.size(), "manifest '{}' is a JSON array cut off after record {} (no closing ']'; "
            "truncated file?)", file, element_);
  if (buf_[pos_] == ']') {
    ++pos_;
    skip_blanks();
    DHP_CHECK(pos_ >= buf_.size(), "manifest '{}': bytes after the JSON array's closing ']' (record {})", file,
              element_);
    closed_ = true;
    return false;
  }
  if (element_ > 0) {
    DHP_CHECK(buf_[pos_] == ',', "manifest '{}' is a JSON array with '{}' where a ',' or ']' should follow "
              "record {}", file, printable(std::string_view(&buf_[pos_], 1)), element_);
    ++pos_;
    skip_blanks();
    DHP_CHECK(pos_ < buf_.size() && buf_[pos_] != ']', "manifest '{}' is a JSON array with a ',' after its "
              "last record ({})", file, element_);
  }
  // One element: to its matching bracket, or a scalar to the next ',' ']' or blank at depth 0.
  // Brackets inside strings do not count.
  size_t at = pos_;
  int depth = 0;
  bool in_string = false, escape = false, done = false;
  while (!done) {
    if (at >= buf_.size()) {
      const size_t scanned = at - pos_;
      DHP_CHECK(fill(), "manifest '{}' is a JSON array cut off in record {} (truncated file?)", file,
                element_ + 1);
      at = pos_ + scanned;  // fill() moved the element to the buffer's start
      continue;
    }
    const char c = buf_[at];
    if (in_string) {
      if (escape) escape = false;
      else if (c == '\\') escape = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (depth == 0) break;  // a scalar element ends at the array's ']'
      done = --depth == 0;
    } else if (depth == 0 && (c == ',' || blank(c))) {
      break;
    }
    if (!done) ++at;
    DHP_CHECK(int64_t(at - pos_) <= max_record_, "manifest '{}': record {} is longer than {} bytes", file,
              element_ + 1, max_record_);
  }
  const size_t end = done ? at + 1 : at;
  record.assign(buf_, pos_, end - pos_);
  pos_ = end;
  ++element_;
  return true;
}

}  // namespace dhp
