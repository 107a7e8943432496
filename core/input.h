// Reading the files a user names as inputs (manifests, shards, indexes, tokenizers, images).
// Each one must be a regular file: opening a FIFO would block until a writer comes, and a
// device would never end, so a wrong path would hang a run instead of stopping it with a
// message. Files are opened with O_NONBLOCK and checked with fstat on the open descriptor, so
// what is checked is what is read. Reads are bounded: a whole-file read by a size cap, a
// line-by-line read by a line cap, and a long read stops when the stop flag is raised.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/text.h"

namespace dhp {

// An open input file: a regular file, or an error naming `what` ("manifest", "shard", ...)
// and the path with the operating system's reason.
class InputFile {
 public:
  // `hint` is appended to the not-found message (which key or option names the file).
  InputFile(const std::string& what, const std::string& path, const std::string& hint = "");
  // Opens `path`, which must lie inside the folder `root`, without leaving `root` on the way:
  // no symlink that leads out of it, no "/proc" magic link, however the file system changes
  // between the check of a path and its use.
  InputFile(const std::string& what, const std::string& root, const std::string& path,
            const std::string& hint);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  // Reads `n` bytes at `offset`; fewer only at the end of the file. Returns the count.
  int64_t read_at(void* out, int64_t n, int64_t offset) const;
  // Asks the kernel to start reading [offset, offset + n) now (readahead); no effect on what
  // is read.
  void prefetch(int64_t offset, int64_t n) const;
  // The whole file, when it holds at most `max_bytes`; else an error naming `cap_name`.
  std::string read_all(int64_t max_bytes, const std::string& cap_name) const;

 private:
  void check_opened(const std::string& hint);
  std::string what_, path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// Longest manifest line read: far beyond any real sample, small enough that a file of one
// endless line (a device, a binary file) stops with a message instead of taking every byte of
// memory.
inline constexpr int64_t kMaxLineBytes = int64_t(64) << 20;

// Splits a file into lines the way std::getline does ('\n' ends a line, a last line without
// one still counts), refusing a line longer than `max_line` bytes and stopping with an error
// when *stop becomes non-zero (a signal handler's flag).
// The streaming step of the chunked readers (LineReader, data/manifest_reader.h): drops the
// first `consumed` bytes of `buf` (what was handed out), appends the file's next `chunk` bytes
// from `offset` and advances it. Returns the bytes read; 0 at the end of the file.
int64_t append_next_chunk(const InputFile& file, std::string& buf, size_t consumed, int64_t& offset,
                          size_t chunk);

class LineReader {
 public:
  LineReader(const std::string& what, const std::string& path, const std::string& hint = "",
             const volatile int* stop = nullptr, int64_t max_line = kMaxLineBytes);
  // The next line without its '\n'; false at the end of the file.
  bool next(std::string& line);
  int64_t line_no() const { return line_no_; }

 private:
  void check_stop() const;
  InputFile file_;
  std::string what_, path_;
  const volatile int* stop_;
  int64_t max_line_;
  std::string buf_;
  size_t pos_ = 0;
  int64_t offset_ = 0, line_no_ = 0;
  bool eof_ = false;
};

}  // namespace dhp
