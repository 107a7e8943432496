// Owns one HDF5 identifier and closes it with the matching function (H5Fclose, H5Dclose...),
// so early returns and exceptions never leak handles. Shared by checkpoints and data shards.
#pragma once

#include <hdf5.h>

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

}  // namespace dhp
