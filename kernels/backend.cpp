#include "kernels/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "core/check.h"

namespace dhp {

const char* dtype_name(DType t) { return t == DType::BF16 ? "bf16" : "fp32"; }

const char* gelu_kind_name(GeluKind k) {
  switch (k) {
    case GeluKind::Tanh: return "tanh";
    case GeluKind::Erf: return "erf";
    case GeluKind::Quick: return "quick";
  }
  DHP_ASSERT(false);
  return "";
}

std::string_view precision_name(Precision p) {
  for (const auto& [value, name] : kPrecisionNames)
    if (value == p) return name;
  DHP_ASSERT(false);
  return {};
}

std::optional<Precision> find_precision(std::string_view name) {
  for (const auto& [value, n] : kPrecisionNames)
    if (n == name) return value;
  return std::nullopt;
}

DeviceBuffer::DeviceBuffer(Backend& backend, size_t bytes)
    : backend_(&backend), data_(bytes ? backend.allocate(bytes) : nullptr), bytes_(bytes) {
  if (data_) backend.note_allocated(bytes);
}

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
  if (data_) {
    backend_->deallocate(data_);
    backend_->note_released(bytes_);
  }
  data_ = nullptr;
  bytes_ = 0;
}

void Arena::reserve(size_t bytes) {
  if (bytes <= buffer_.bytes()) return;
  // An eighth of headroom, so that shapes growing by a few tokens at a time do not reallocate
  // each time (each reallocation grows the arena by at least that much). The memory model
  // counts the same eighth (parallel/memory_model.h).
  constexpr size_t kGranule = size_t(64) << 10;
  const size_t want = bytes + bytes / 8;
  buffer_.reset();
  buffer_ = DeviceBuffer(backend_, (want + kGranule - 1) / kGranule * kGranule);
}

int launcher_local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var)) return std::max(0, std::atoi(v));
  return -1;
}

void BackendRegistry::add(const std::string& name, Factory make, Probe unusable, Describe describe) {
  factories_[name] = Entry{std::move(make), std::move(unusable), std::move(describe)};
}

std::string BackendRegistry::device_name(const std::string& name, int ordinal) const {
  const auto it = factories_.find(name);
  return it == factories_.end() || !it->second.describe ? std::string() : it->second.describe(ordinal);
}

std::string BackendRegistry::resolve(const std::string& name) const {
  if (name != "auto") return name;
  auto it = factories_.find("cuda");
  if (it == factories_.end()) {
    spdlog::info("device auto: cpu (this build has no CUDA backend)");
    return "cpu";
  }
  const std::string why_not = it->second.unusable ? it->second.unusable() : std::string();
  if (!why_not.empty()) {
    spdlog::info("device auto: cpu (CUDA backend compiled, but {})", why_not);
    return "cpu";
  }
  spdlog::info("device auto: cuda (a CUDA device is available)");
  return "cuda";
}

std::unique_ptr<Backend> BackendRegistry::make(const std::string& name,
                                               const BackendOptions& opt) const {
  const std::string resolved = resolve(name);
  // Checked after "auto" is resolved, as the configuration's check is for "cpu": a run that
  // asked for cuDNN's attention and landed on a machine without a usable GPU stops here, not
  // after training with another attention than the one asked for.
  if (resolved == "cpu" && opt.attention == AttentionImpl::cudnn) {
    const auto cuda = factories_.find("cuda");
    const std::string why = cuda == factories_.end() ? "this build has no CUDA backend"
                            : cuda->second.unusable  ? cuda->second.unusable()
                                                     : "";
    throw Error(fmt::format("train.attention = \"cudnn\" needs a CUDA device, and this run is on the "
                            "CPU{}; set train.attention = \"auto\" (or \"own\") to run on the CPU",
                            why.empty() ? "" : " (" + why + ")"));
  }
  auto it = factories_.find(resolved);
  DHP_CHECK(it != factories_.end(), "device \"{}\": this build has no such backend (it has: {})",
            resolved, fmt::join(names(), ", "));
  BackendOptions o = opt;
  o.precision = resolve_precision(opt.precision, resolved == "cuda" ? Device::CUDA : Device::CPU);
  return it->second.make(o);
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
