// Typed helpers over the HDF5 C API for data shards and the dataset index. Every dataset is
// contiguous, unfiltered and written without timestamps, so the same content gives
// byte-identical files, and readers may pread() a dataset's raw bytes at its file offset
// (HDF5 keeps no thread-safe lock of its own in the serial build we link).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/files.h"
#include "data/h5.h"

namespace dhp {

// Held around every HDF5 call in data/: the serial HDF5 library is not thread-safe.
std::mutex& hdf5_mutex();

class H5Writer {
 public:
  // Creates (truncates) `path`.
  explicit H5Writer(const std::string& path);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;

  // Row-major (rows, cols) arrays, stored little-endian; cols = 1 gives a 1-D dataset.
  void i64(const char* name, const std::vector<int64_t>& v, int64_t cols = 1);
  void i32(const char* name, const std::vector<int32_t>& v);
  void u8(const char* name, const std::vector<uint8_t>& v);
  void text(const char* name, const std::string& s);  // stored as bytes
  void attr(const char* name, int64_t v);
  void attr(const char* name, const std::string& s);
  // Flushes, closes and fsyncs the file: after this returns the bytes are on disk.
  void close();

 private:
  void put(const char* name, hid_t file_type, hid_t mem_type, const void* data, int64_t rows,
           int64_t cols);
  std::string path_;
  hid_t file_ = -1;
};

class H5Reader {
 public:
  // Throws dhp::Error when the file is missing, not a regular file, or not HDF5; reads of a
  // damaged file throw an error that says so with HDF5's reason.
  explicit H5Reader(const std::string& path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;

  bool has(const char* name) const;
  std::vector<int64_t> i64(const char* name, int64_t cols = 1) const;
  std::vector<int32_t> i32(const char* name) const;
  std::vector<uint8_t> u8(const char* name) const;
  std::string text(const char* name) const;
  bool has_attr(const char* name) const;
  int64_t attr_i64(const char* name) const;
  std::string attr_str(const char* name) const;
  // File offset of a dataset's raw bytes and their count (offset -1 for an empty dataset).
  struct Extent {
    int64_t offset = -1, bytes = 0;
  };
  Extent extent(const char* name) const;

 private:
  hid_t open(const char* name) const;
  void check_attribute(const char* name) const;
  int64_t rows(hid_t d, int64_t cols) const;
  std::string path_;
  hid_t file_ = -1;
};

}  // namespace dhp
