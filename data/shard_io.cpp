#include "data/shard_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

#include "core/check.h"
#include "core/files.h"
#include "core/input.h"

namespace dhp {

namespace {

// HDF5 prints its own error stack on every failure; we report errors ourselves.
void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

herr_t innermost(unsigned n, const H5E_error2_t* e, void* out) {
  if (n == 0 && e->desc) *static_cast<std::string*>(out) = e->desc;
  return 0;
}

// Why the last HDF5 call failed, as HDF5 says it where the error was detected.
std::string hdf5_reason() {
  std::string reason;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, &reason);
  return "HDF5: " + (reason.empty() ? std::string("no reason given") : printable(reason));
}

}  // namespace

std::mutex& hdf5_mutex() {
  static std::mutex mu;
  return mu;
}

H5Writer::H5Writer(const std::string& path) : path_(path) {
  quiet();
  // No modification times in object headers: identical content, identical bytes.
  H5 fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  H5Pset_obj_track_times(fcpl, false);
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
  DHP_CHECK(file_ >= 0, "cannot create HDF5 file '{}'", path);
}

H5Writer::~H5Writer() {
  if (file_ >= 0) H5Fclose(file_);
}

void H5Writer::put(const char* name, hid_t file_type, hid_t mem_type, const void* data,
                   int64_t rows, int64_t cols) {
  const hsize_t dims[2] = {hsize_t(rows), hsize_t(cols)};
  H5 space(H5Screate_simple(cols == 1 ? 1 : 2, dims, nullptr), H5Sclose);
  H5 dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_obj_track_times(dcpl, false);
  H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  // Space is allocated at creation and never pre-filled: we write every byte ourselves.
  H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
  H5 d(H5Dcreate2(file_, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  DHP_CHECK(d.ok(), "'{}': cannot create dataset {}", path_, name);
  if (rows > 0)
    DHP_CHECK(H5Dwrite(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0,
              "'{}': cannot write dataset {} (disk full?)", path_, name);
}

void H5Writer::i64(const char* name, const std::vector<int64_t>& v, int64_t cols) {
  DHP_ASSERT(cols > 0 && int64_t(v.size()) % cols == 0);
  put(name, H5T_STD_I64LE, H5T_NATIVE_INT64, v.data(), int64_t(v.size()) / cols, cols);
}
void H5Writer::i32(const char* name, const std::vector<int32_t>& v) {
  put(name, H5T_STD_I32LE, H5T_NATIVE_INT32, v.data(), int64_t(v.size()), 1);
}
void H5Writer::u8(const char* name, const std::vector<uint8_t>& v) {
  put(name, H5T_STD_U8LE, H5T_NATIVE_UINT8, v.data(), int64_t(v.size()), 1);
}
void H5Writer::text(const char* name, const std::string& s) {
  put(name, H5T_STD_U8LE, H5T_NATIVE_UINT8, s.data(), int64_t(s.size()), 1);
}

void H5Writer::attr(const char* name, int64_t v) {
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 a(H5Acreate2(file_, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  DHP_CHECK(a.ok() && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0, "'{}': writing attribute {}",
            path_, name);
}

void H5Writer::attr(const char* name, const std::string& s) {
  H5 type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(s.size(), 1));
  H5 space(H5Screate(H5S_SCALAR), H5Sclose);
  H5 a(H5Acreate2(file_, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::string padded = s;
  padded.resize(std::max<size_t>(s.size(), 1), '\0');
  DHP_CHECK(a.ok() && H5Awrite(a, type, padded.data()) >= 0, "'{}': writing attribute {}",
            path_, name);
}

void H5Writer::close() {
  DHP_CHECK(H5Fflush(file_, H5F_SCOPE_GLOBAL) >= 0 && H5Fclose(file_) >= 0,
            "cannot finish writing '{}' (disk full?)", path_);
  file_ = -1;
  fsync_path(path_, false);
}

H5Reader::H5Reader(const std::string& path) : path_(path) {
  quiet();
  // Checked here because HDF5 opens without O_NONBLOCK: a FIFO would block it for ever.
  InputFile("HDF5 file", path);
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  DHP_CHECK(file_ >= 0, "'{}' is not a readable HDF5 file (damaged or truncated?; {})",
            printable(path), hdf5_reason());
}

H5Reader::~H5Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool H5Reader::has(const char* name) const {
  // Negative when the file's structure cannot be read at all, which is damage, not absence.
  const htri_t found = H5Lexists(file_, name, H5P_DEFAULT);
  DHP_CHECK(found >= 0, "'{}' is damaged: looking up {} failed ({}); rebuild it",
            printable(path_), name, hdf5_reason());
  return found > 0;
}

hid_t H5Reader::open(const char* name) const {
  DHP_CHECK(has(name), "'{}' has no dataset {} (not built by this version of dhp?)", path_, name);
  const hid_t d = H5Dopen2(file_, name, H5P_DEFAULT);
  DHP_CHECK(d >= 0, "'{}' is damaged: dataset {} cannot be opened ({})", printable(path_), name,
            hdf5_reason());
  return d;
}

int64_t H5Reader::rows(hid_t d, int64_t cols) const {
  H5 space(H5Dget_space(d), H5Sclose);
  hsize_t dims[2] = {0, 1};
  const int rank = H5Sget_simple_extent_ndims(space);
  DHP_CHECK(rank == (cols == 1 ? 1 : 2), "'{}': a dataset has rank {}, expected {}", path_, rank,
            cols == 1 ? 1 : 2);
  H5Sget_simple_extent_dims(space, dims, nullptr);
  DHP_CHECK(int64_t(dims[1]) == cols || cols == 1, "'{}': a dataset has {} columns, expected {}",
            path_, dims[1], cols);
  return int64_t(dims[0]);
}

template <typename T>
std::vector<T> read_all(hid_t file_d, hid_t mem_type, int64_t n, const std::string& path,
                        const char* name) {
  std::vector<T> out(size_t(std::max<int64_t>(n, 0)));
  if (n > 0)
    DHP_CHECK(H5Dread(file_d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0,
              "'{}' is damaged: dataset {} cannot be read ({})", printable(path), name,
              hdf5_reason());
  return out;
}

std::vector<int64_t> H5Reader::i64(const char* name, int64_t cols) const {
  H5 d(open(name), H5Dclose);
  return read_all<int64_t>(d, H5T_NATIVE_INT64, rows(d, cols) * cols, path_, name);
}
std::vector<int32_t> H5Reader::i32(const char* name) const {
  H5 d(open(name), H5Dclose);
  return read_all<int32_t>(d, H5T_NATIVE_INT32, rows(d, 1), path_, name);
}
std::vector<uint8_t> H5Reader::u8(const char* name) const {
  H5 d(open(name), H5Dclose);
  return read_all<uint8_t>(d, H5T_NATIVE_UINT8, rows(d, 1), path_, name);
}
std::string H5Reader::text(const char* name) const {
  const std::vector<uint8_t> b = u8(name);
  return std::string(b.begin(), b.end());
}

void H5Reader::check_attribute(const char* name) const {
  const htri_t found = H5Aexists(file_, name);
  DHP_CHECK(found >= 0, "'{}' is damaged: looking up attribute {} failed ({}); rebuild it",
            printable(path_), name, hdf5_reason());
  DHP_CHECK(found > 0, "'{}' has no attribute {}", path_, name);
}

bool H5Reader::has_attr(const char* name) const {
  const htri_t found = H5Aexists(file_, name);
  DHP_CHECK(found >= 0, "'{}' is damaged: looking up attribute {} failed ({}); rebuild it",
            printable(path_), name, hdf5_reason());
  return found > 0;
}

int64_t H5Reader::attr_i64(const char* name) const {
  check_attribute(name);
  H5 a(H5Aopen(file_, name, H5P_DEFAULT), H5Aclose);
  int64_t v = 0;
  DHP_CHECK(a.ok() && H5Aread(a, H5T_NATIVE_INT64, &v) >= 0, "'{}': cannot read attribute {}",
            path_, name);
  return v;
}

std::string H5Reader::attr_str(const char* name) const {
  check_attribute(name);
  H5 a(H5Aopen(file_, name, H5P_DEFAULT), H5Aclose);
  H5 type(H5Aget_type(a), H5Tclose);
  DHP_CHECK(H5Tget_class(type) == H5T_STRING, "'{}': attribute {} is not a string", path_, name);
  std::string s(H5Tget_size(type), '\0');
  DHP_CHECK(H5Aread(a, type, s.data()) >= 0, "'{}': cannot read attribute {}", path_, name);
  s.resize(s.find('\0') == std::string::npos ? s.size() : s.find('\0'));
  return s;
}

H5Reader::Extent H5Reader::extent(const char* name) const {
  H5 d(open(name), H5Dclose);
  Extent e;
  e.bytes = int64_t(H5Dget_storage_size(d));
  const haddr_t off = H5Dget_offset(d);
  if (e.bytes > 0) {
    DHP_CHECK(off != HADDR_UNDEF, "'{}': dataset {} is not stored contiguously", path_, name);
    e.offset = int64_t(off);
  }
  return e;
}

}  // namespace dhp
