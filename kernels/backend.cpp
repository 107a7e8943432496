#include "kernels/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kernels/check.h"

namespace dhp {

DeviceBuffer::DeviceBuffer(Backend& backend, size_t bytes)
    : backend_(&backend), data_(bytes ? backend.allocate(bytes) : nullptr), bytes_(bytes) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    backend_ = o.backend_;
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.backend_ = nullptr;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (data_) backend_->deallocate(data_);
  data_ = nullptr;
  bytes_ = 0;
}

void Arena::reserve(size_t bytes) {
  if (bytes <= buffer_.bytes()) return;
  // Round up so that shapes growing by a few tokens at a time do not reallocate each time.
  constexpr size_t kGranule = size_t(1) << 20;
  const size_t want = std::max(bytes + bytes / 8, buffer_.bytes() + buffer_.bytes() / 4);
  buffer_.reset();
  buffer_ = DeviceBuffer(backend_, (want + kGranule - 1) / kGranule * kGranule);
}

void BackendRegistry::add(const std::string& name, Factory make) {
  factories_[name] = std::move(make);
}

std::unique_ptr<Backend> BackendRegistry::make(const std::string& name,
                                               const BackendOptions& opt) const {
  auto it = factories_.find(name);
  DHP_CHECK(it != factories_.end(), "device \"{}\": this build has no such backend (it has: {})",
            name, fmt::join(names(), ", "));
  return it->second(opt);
}

std::vector<std::string> BackendRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, f] : factories_) out.push_back(name);
  return out;
}

BackendRegistry& backend_registry() {
  static BackendRegistry registry = [] {
    BackendRegistry r;
    r.add("cpu", make_cpu_backend);
    return r;
  }();
  return registry;
}

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt) {
  return backend_registry().make(name, opt);
}

}  // namespace dhp
