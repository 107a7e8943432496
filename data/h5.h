// Owns one HDF5 identifier and closes it with the matching function (H5Fclose, H5Dclose...),
// so early returns and exceptions never leak handles. Shared by checkpoints and data shards.
#pragma once

#include <hdf5.h>

#include <string>

namespace dhp {

class H5 {
 public:
  H5(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~H5() {
    if (id_ >= 0) close_(id_);
  }
  H5(const H5&) = delete;
  H5& operator=(const H5&) = delete;
  operator hid_t() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// Stops HDF5 printing its own error stack on every failure: we report errors ourselves.
void quiet_hdf5();

// Why the last HDF5 call failed: the operating system's reason when HDF5's file driver
// recorded one ("No space left on device"), else HDF5's description where it detected the
// error ("incorrect metadata checksum after all read attempts"). Read at once: the next HDF5
// call, a handle's close included, clears the stack.
std::string hdf5_reason();

// File access in HDF5's newest format, whose object headers (attributes, links, shapes) carry
// checksums: a damaged header is reported ("incorrect metadata checksum") instead of followed,
// which in the oldest format can crash the library. Files in older formats still open.
inline H5 newest_format_access() {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
  return H5(fapl, H5Pclose);
}

}  // namespace dhp
