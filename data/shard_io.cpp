#include "data/shard_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "core/hash.h"
#include "core/files.h"
#include "core/input.h"

namespace dhp {

namespace {

// Why the last HDF5 call failed, marked as HDF5's (printable: it may quote file bytes).
std::string hdf5_why() { return "HDF5: " + printable(hdf5_reason()); }

constexpr char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";
constexpr char kSealMagic[] = "dhp-seal fnv1a64 ";

// The seal line: the magic, then the checksum and the count of the bytes after the user block.
std::string seal_line(uint64_t hash, int64_t bytes) {
  return fmt::format("{}{:016x} {}\n", kSealMagic, hash, bytes);
}

// Checks a sealed file's checksum; an unsealed HDF5 file (one written before seals) passes.
void check_seal(const InputFile& in, const std::string& path) {
  std::string head(size_t(kSealBytes), '\0');
  const int64_t got = in.read_at(head.data(), kSealBytes, 0);
  if (!(got == kSealBytes && head.starts_with(kSealMagic))) {
    DHP_CHECK(got >= 8 && head.starts_with(std::string_view(kHdf5Signature, 8)),
              "'{}' is damaged or not an HDF5 file: it starts with neither dhp's seal nor "
              "HDF5's signature",
              printable(path));
    return;
  }
  const int64_t bytes = in.size() - kSealBytes;
  DHP_CHECK(seal_line(hash_from(in, kSealBytes), bytes) == head.substr(0, head.find('\n') + 1),
            "'{}' is damaged: its {} bytes do not match the checksum and size sealed into it "
            "when it was written; rebuild it",
            printable(path), bytes);
}

}  // namespace

void seal_file(const std::string& path) {
  std::string head;
  {
    const InputFile in("HDF5 file", path);
    head = seal_line(hash_from(in, kSealBytes), in.size() - kSealBytes);
  }
  head.resize(size_t(kSealBytes), '\0');
  const int fd = ::open(path.c_str(), O_WRONLY);
  DHP_CHECK(fd >= 0, "cannot open '{}' to seal it: {}", printable(path), std::strerror(errno));
  const ssize_t put = ::pwrite(fd, head.data(), head.size(), 0);
  ::close(fd);
  DHP_CHECK(put == ssize_t(head.size()), "cannot seal '{}' (disk full?)", printable(path));
}

std::mutex& hdf5_mutex() {
  static std::mutex mu;
  return mu;
}

H5Writer::H5Writer(const std::string& path, Seal seal) : path_(path), seal_(seal) {
  quiet_hdf5();
  // No modification times in object headers: identical content, identical bytes.
  H5 fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  H5Pset_obj_track_times(fcpl, false);
  if (seal == Seal::whole_file) H5Pset_userblock(fcpl, hsize_t(kSealBytes));
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, newest_format_access());
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
  if (seal_ == Seal::whole_file) seal_file(path_);
  fsync_path(path_, false);
}

H5Reader::H5Reader(const std::string& path) : path_(path) {
  quiet_hdf5();
  // Checked here because HDF5 opens without O_NONBLOCK: a FIFO would block it for ever.
  const InputFile in("HDF5 file", path);
  check_seal(in, path);
  file_bytes_ = in.size();
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  DHP_CHECK(file_ >= 0, "'{}' is not a readable HDF5 file (damaged or truncated?; {})",
            printable(path), hdf5_why());
}

std::string H5Reader::damaged(const std::string& what) const {
  if (!format_known_) return fmt::format("'{}': {}", printable(path_), what);
  return fmt::format("'{}' is damaged: {}; rebuild it", printable(path_), what);
}

H5Reader::~H5Reader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool H5Reader::has(const char* name) const {
  // Negative when the file's structure cannot be read at all, which is damage, not absence.
  const htri_t found = H5Lexists(file_, name, H5P_DEFAULT);
  DHP_CHECK(found >= 0, "'{}' is damaged: looking up {} failed ({}); rebuild it",
            printable(path_), name, hdf5_why());
  return found > 0;
}

hid_t H5Reader::open(const char* name) const {
  DHP_CHECK(has(name), "{}",
            format_known_ ? damaged(fmt::format("HDF5 finds no dataset {}", name))
                          : fmt::format("'{}' has no dataset {} (not built by this version of "
                                        "dhp?)",
                                        printable(path_), name));
  const hid_t d = H5Dopen2(file_, name, H5P_DEFAULT);
  DHP_CHECK(d >= 0, "'{}' is damaged: dataset {} cannot be opened ({})", printable(path_), name,
            hdf5_why());
  return d;
}

int64_t H5Reader::rows(hid_t d, const char* name, int64_t cols, int64_t element_bytes) const {
  H5 space(H5Dget_space(d), H5Sclose);
  DHP_CHECK(space.ok(), "{}", damaged(fmt::format("dataset {} has no readable shape ({})", name,
                                                  hdf5_why())));
  hsize_t dims[2] = {0, 1};
  const int rank = H5Sget_simple_extent_ndims(space);
  const int want = cols == 1 ? 1 : 2;
  DHP_CHECK(rank == want, "{}",
            damaged(fmt::format("HDF5 reads dataset {} as rank {}, expected {}", name, rank,
                                want)));
  DHP_CHECK(H5Sget_simple_extent_dims(space, dims, nullptr) == rank, "{}",
            damaged(fmt::format("dataset {} has no readable shape ({})", name, hdf5_why())));
  DHP_CHECK(int64_t(dims[1]) == cols, "{}",
            damaged(fmt::format("HDF5 reads dataset {} as {} columns, expected {}", name,
                                dims[1], cols)));
  // Every dataset is contiguous and allocated when written, so its stored bytes are exactly
  // its shape's. A shape read from a damaged header is caught here, before anything is
  // allocated for it.
  const hsize_t stored = H5Dget_storage_size(d);
  const bool fits = dims[0] <= hsize_t(file_bytes_) && stored <= hsize_t(file_bytes_);
  DHP_CHECK(fits && dims[0] * hsize_t(cols * element_bytes) == stored, "{}",
            damaged(fmt::format("HDF5 reads dataset {} as {} rows of {} bytes, but it stores {} "
                                "bytes in a file of {}",
                                name, dims[0], cols * element_bytes, stored, file_bytes_)));
  return int64_t(dims[0]);
}

template <typename T>
std::vector<T> read_all(hid_t file_d, hid_t mem_type, int64_t n, const std::string& path,
                        const char* name) {
  std::vector<T> out(size_t(std::max<int64_t>(n, 0)));
  if (n > 0)
    DHP_CHECK(H5Dread(file_d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0,
              "'{}' is damaged: dataset {} cannot be read ({})", printable(path), name,
              hdf5_why());
  return out;
}

std::vector<int64_t> H5Reader::i64(const char* name, int64_t cols) const {
  H5 d(open(name), H5Dclose);
  return read_all<int64_t>(d, H5T_NATIVE_INT64, rows(d, name, cols, 8) * cols, path_, name);
}
std::vector<int32_t> H5Reader::i32(const char* name) const {
  H5 d(open(name), H5Dclose);
  return read_all<int32_t>(d, H5T_NATIVE_INT32, rows(d, name, 1, 4), path_, name);
}
std::vector<uint8_t> H5Reader::u8(const char* name) const {
  H5 d(open(name), H5Dclose);
  return read_all<uint8_t>(d, H5T_NATIVE_UINT8, rows(d, name, 1, 1), path_, name);
}
std::string H5Reader::text(const char* name) const {
  const std::vector<uint8_t> b = u8(name);
  return std::string(b.begin(), b.end());
}

void H5Reader::check_attribute(const char* name) const {
  const htri_t found = H5Aexists(file_, name);
  DHP_CHECK(found >= 0, "'{}' is damaged: looking up attribute {} failed ({}); rebuild it",
            printable(path_), name, hdf5_why());
  DHP_CHECK(found > 0, "{}", damaged(fmt::format("HDF5 finds no attribute {}", name)));
}

bool H5Reader::has_attr(const char* name) const {
  const htri_t found = H5Aexists(file_, name);
  DHP_CHECK(found >= 0, "'{}' is damaged: looking up attribute {} failed ({}); rebuild it",
            printable(path_), name, hdf5_why());
  return found > 0;
}

int64_t H5Reader::attr_i64(const char* name) const {
  check_attribute(name);
  H5 a(H5Aopen(file_, name, H5P_DEFAULT), H5Aclose);
  int64_t v = 0;
  DHP_CHECK(a.ok() && H5Aread(a, H5T_NATIVE_INT64, &v) >= 0, "{}",
            damaged(fmt::format("attribute {} cannot be read ({})", name, hdf5_why())));
  return v;
}

std::string H5Reader::attr_str(const char* name) const {
  check_attribute(name);
  H5 a(H5Aopen(file_, name, H5P_DEFAULT), H5Aclose);
  H5 type(H5Aget_type(a), H5Tclose);
  DHP_CHECK(a.ok() && type.ok() && H5Tget_class(type) == H5T_STRING, "{}",
            damaged(fmt::format("HDF5 reads attribute {} as something other than a string",
                                name)));
  const size_t bytes = H5Tget_size(type);
  DHP_CHECK(bytes <= size_t(file_bytes_), "{}",
            damaged(fmt::format("HDF5 reads attribute {} as {} bytes long, in a file of {}",
                                name, bytes, file_bytes_)));
  std::string s(bytes, '\0');
  DHP_CHECK(H5Aread(a, type, s.data()) >= 0, "{}",
            damaged(fmt::format("attribute {} cannot be read ({})", name, hdf5_why())));
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
