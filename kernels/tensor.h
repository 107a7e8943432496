// A tensor: shape, dtype, device, and either its own storage or a view of someone else's.
// Kernels take raw pointers plus sizes (they never allocate); Tensor is how the code that
// calls them keeps shapes and ownership straight.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dhp {

enum class DType { F32, BF16, I32 };
enum class Device { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

class Tensor {
 public:
  Tensor() = default;
  // Owning, zero-filled CPU tensor.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::F32);
  // Non-owning view of memory that outlives the tensor.
  static Tensor view(void* data, std::vector<int64_t> shape, DType dtype = DType::F32,
                     Device device = Device::CPU);

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int64_t numel() const;
  size_t nbytes() const { return numel() * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool owning() const { return storage_ != nullptr; }

  void* data() const { return data_; }
  float* f32() const;
  int32_t* i32() const;

  // Rows [begin, end) of the first dimension, as a view sharing the storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // Same memory, another shape with the same element count.
  Tensor reshape(std::vector<int64_t> shape) const;
  std::string describe() const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

}  // namespace dhp
