#include "kernels/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <cstring>

#include "kernels/check.h"

namespace dhp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
  }
  return "?";
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  size_t bytes = std::max<size_t>(t.nbytes(), 1);
  // 64-byte alignment keeps vector loads of every row start aligned.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  DHP_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  t.storage_ = std::shared_ptr<void>(p, std::free);
  t.data_ = p;
  return t;
}

Tensor Tensor::view(void* data, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.data_ = data;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

float* Tensor::f32() const {
  DHP_ASSERT(dtype_ == DType::F32);
  return static_cast<float*>(data_);
}

int32_t* Tensor::i32() const {
  DHP_ASSERT(dtype_ == DType::I32);
  return static_cast<int32_t*>(data_);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  DHP_ASSERT(!shape_.empty() && begin >= 0 && begin <= end && end <= shape_[0]);
  Tensor t = *this;
  t.shape_[0] = end - begin;
  int64_t row = shape_[0] ? numel() / shape_[0] : 0;
  t.data_ = static_cast<char*>(data_) + begin * row * dtype_size(dtype_);
  return t;
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  DHP_ASSERT(t.numel() == numel());
  return t;
}

std::string Tensor::describe() const {
  return fmt::format("{}({}) on {}{}", dtype_name(dtype_), fmt::join(shape_, ", "),
                     device_ == Device::CPU ? "cpu" : "cuda", owning() ? "" : " (view)");
}

}  // namespace dhp
