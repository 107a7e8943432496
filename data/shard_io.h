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

// A sealed file carries the FNV-1a checksum of its HDF5 bytes in a user block ahead of them,
// and H5Reader checks it before HDF5 parses anything: the serial HDF5 1.10 library can crash,
// not fail, on a damaged object header, and a damaged table can read as plausible numbers.
// Files small enough to hash at every open (the dataset index) are sealed; shards, read in
// part, rely on HDF5's own metadata checksums and on per-sample ones.
enum class Seal { none, whole_file };
inline constexpr int64_t kSealBytes = 512;  // HDF5's smallest user block
// Writes the seal of an HDF5 file created with Seal::whole_file (H5Writer::close does this).
void seal_file(const std::string& path);

class H5Writer {
 public:
  // Creates (truncates) `path`, in the newest HDF5 file format, whose metadata is checksummed.
  explicit H5Writer(const std::string& path, Seal seal = Seal::none);
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
  Seal seal_;
};

class H5Reader {
 public:
  // Throws dhp::Error when the file is missing, not a regular file, not HDF5, or sealed and
  // not matching its seal (an unsealed file is read as it is); reads of a damaged file throw
  // an error that says so with HDF5's reason.
  explicit H5Reader(const std::string& path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;

  // Called once the file's format and version are known to be this dhp's: from then on a
  // missing attribute or dataset, or one of the wrong shape, is reported as damage.
  void format_is_known() { format_known_ = true; }

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
  int64_t rows(hid_t d, const char* name, int64_t cols, int64_t element_bytes) const;
  // The message for an attribute or dataset that is absent or malformed.
  std::string damaged(const std::string& what) const;
  std::string path_;
  hid_t file_ = -1;
  int64_t file_bytes_ = 0;
  bool format_known_ = false;
};

}  // namespace dhp
