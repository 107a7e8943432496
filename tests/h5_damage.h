// Damage as a disk does it, for the tests of checkpoints and their parts.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <fstream>
#include <string>

namespace dhp::testing {

// Flips one bit inside dataset `name`'s stored data (past its first elements): the file stays
// a readable HDF5 file and only the dataset's checksum can tell.
inline void flip_tensor_byte(const std::string& file, const char* name) {
  hsize_t offset = 0;
  {
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
    offset = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
  }
  ASSERT_GT(offset, 0u);
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(std::streamoff(offset + 17));
  char c = 0;
  io.read(&c, 1);
  c ^= 0x10;
  io.seekp(std::streamoff(offset + 17));
  io.write(&c, 1);
}

}  // namespace dhp::testing
