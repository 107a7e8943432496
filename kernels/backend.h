// A device as the rest of dhp sees it: memory (raw allocations, which only arenas and
// long-lived buffers take), transfers between host and device, a stream to synchronise, and
// the ops that run there. The model, the optimizer and the communicators talk to a Backend,
// never to a concrete device, so adding a device means adding files under kernels/.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/ops.h"

namespace dhp {

enum class Device { CPU, CUDA };

// train.precision, parsed once where the configuration is read and passed on as a value.
//   fp32: fp32 storage and arithmetic (the reference).
//   tf32: fp32 storage, TF32 tensor-core products on devices that have them (the CPU computes
//         fp32).
//   bf16: activations and the working copy of the weights stored in bf16, bf16 tensor-core
//         products with fp32 accumulation; master weights, gradients and optimizer state stay
//         fp32 (Ops::dtype).
//   auto: bf16 on a CUDA device, fp32 on the CPU (which computes fp32 alone); what the
//         configuration holds until the device is known (resolve_precision), never what a
//         backend runs.
enum class Precision : uint8_t { fp32, tf32, bf16, automatic };
inline constexpr std::pair<Precision, std::string_view> kPrecisionNames[] = {
    {Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::bf16, "bf16"}, {Precision::automatic, "auto"}};
// `p` with "auto" made the device's default.
inline Precision resolve_precision(Precision p, Device d) {
  return p != Precision::automatic ? p : d == Device::CUDA ? Precision::bf16 : Precision::fp32;
}
std::string_view precision_name(Precision p);
std::optional<Precision> find_precision(std::string_view name);
// The storage dtype of activations and working weights.
inline DType storage_dtype(Precision p) { return p == Precision::bf16 ? DType::BF16 : DType::F32; }

// Which attention kernel the CUDA backend runs (train.attention): its own (kernels/cuda/
// attention_kernels.cuh), cuDNN's fused attention where it can express the call's mask
// (kernels/cuda/cudnn_attention.h), or per shape class whichever measured faster. The CPU
// backend has one kernel and ignores it.
enum class AttentionImpl : uint8_t { automatic, own, cudnn };
inline constexpr std::pair<AttentionImpl, std::string_view> kAttentionImplNames[] = {
    {AttentionImpl::automatic, "auto"}, {AttentionImpl::own, "own"}, {AttentionImpl::cudnn, "cudnn"}};

// One shape class's attention timing (Backend::take_attention_timings): the class as the
// backend encodes it, and the seconds of its own kernel and of the library on one call.
struct AttnTiming {
  static constexpr int kKey = 9;
  int64_t key[kKey] = {};
  double own_s = 0, lib_s = 0;
};

struct BackendOptions {
  int threads = 1;            // CPU compute threads (>= 1)
  bool adapt_threads = false;  // CPU: follow the cores other processes leave free
  int device = 0;   // device ordinal, for backends with several devices
  Precision precision = Precision::fp32;
  AttentionImpl attention = AttentionImpl::automatic;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual const Ops& ops() const = 0;

  // Device memory. Callers hold it through DeviceBuffer and Arena, which keeps the steady
  // state of a step free of allocations (allocations() counts them, for tests and benches).
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;

  // Transfers are ordered on the backend's stream; download() returns once the data is on the
  // host, so it is the one point where the host waits for the device.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // Called between training steps; the CPU backend matches its compute threads to the cores
  // that other processes leave free (results do not depend on the thread count).
  virtual void adapt_to_load() {}
  // Compute threads (CPU) or 1.
  virtual int threads() const { return 1; }
  // train.attention = "auto": the attention timings this process took since the last call
  // (each shape class it met for the first time, own kernel against the library), and the
  // choices to install from everyone's (trainer/agreement.h gathers them between steps, so
  // every rank makes the same choice). Until a class is agreed its calls run the own kernel.
  virtual std::vector<AttnTiming> take_attention_timings() { return {}; }
  virtual void agree_attention(const std::vector<AttnTiming>& everyone) { (void)everyone; }
  // The native stream the ops run on (a cudaStream_t), for a device communicator that must
  // order its transfers after them; null where there is none (the CPU).
  virtual void* stream_handle() const { return nullptr; }

  int64_t allocations() const { return allocations_; }
  // Bytes this backend's DeviceBuffers (arenas included) hold now, and the most they held
  // since the backend was made or reset_peak() was last called: the measured side of the
  // planner's memory model. Allocations outside DeviceBuffer (a library's own workspace) are
  // not seen.
  int64_t bytes_in_use() const { return in_use_; }
  int64_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = in_use_; }
  void note_allocated(size_t bytes) {
    in_use_ += int64_t(bytes);
    peak_ = std::max(peak_, in_use_);
  }
  void note_released(size_t bytes) { in_use_ -= int64_t(bytes); }

 protected:
  int64_t allocations_ = 0;

 private:
  int64_t in_use_ = 0, peak_ = 0;
};

// Move-only ownership of one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& backend, size_t bytes);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  void reset();

 private:
  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Hands out aligned, typed slices of one buffer. Used in two passes by Arena::carve: a first
// pass with no memory measures the layout, the second hands out real pointers.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <class T>
  T* take(int64_t n) {
    return static_cast<T*>(take_bytes(size_t(n) * sizeof(T)));
  }
  // n elements of a run-time storage dtype.
  Act take(int64_t n, DType t) { return {take_bytes(size_t(n) * dtype_size(t)), t}; }
  void* take_bytes(size_t bytes) {
    offset_ = (offset_ + kAlign - 1) / kAlign * kAlign;
    void* p = base_ ? base_ + offset_ : nullptr;
    offset_ += bytes;
    return p;
  }
  size_t size() const { return offset_; }

 private:
  static constexpr size_t kAlign = 64;  // a cache line, and enough for vector loads on GPUs
  char* base_;
  size_t offset_ = 0;
};

// One device buffer carved into the buffers of a shape (llm.c's ActivationTensors): `layout`
// is a function that takes every slice it needs from a Carver. The buffer grows only when a
// layout is larger than every earlier one, so after the largest shape has been seen a carve
// allocates nothing. Carving invalidates the pointers of the previous carve.
class Arena {
 public:
  explicit Arena(Backend& backend) : backend_(backend) {}
  template <class Layout>
  void carve(Layout&& layout) {
    Carver measure(nullptr);
    layout(measure);
    reserve(measure.size());
    Carver real(buffer_.as<char>());
    layout(real);
    carved_ = measure.size();
  }
  size_t capacity() const { return buffer_.bytes(); }
  // Bytes the last layout took (capacity() also holds the headroom of growth).
  size_t carved() const { return carved_; }

 private:
  void reserve(size_t bytes);
  Backend& backend_;
  DeviceBuffer buffer_;
  size_t carved_ = 0;
};

// Backends by name ("cpu", and "cuda" where a build registers it). The registry is filled
// once at start-up, before any backend is made.
class BackendRegistry {
 public:
  using Factory = std::function<std::unique_ptr<Backend>(const BackendOptions&)>;
  // Says why the backend cannot run on this machine, or "" when it can (e.g. no driver).
  using Probe = std::function<std::string()>;
  // The product name of device `ordinal` ("NVIDIA H100 80GB HBM3"), or "" when unknown.
  using Describe = std::function<std::string(int ordinal)>;
  void add(const std::string& name, Factory make, Probe unusable = {}, Describe describe = {});
  // "auto" becomes "cuda" where this build has it and a device is usable, else "cpu", and the
  // choice is logged with its reason; any other name is returned as it is.
  std::string resolve(const std::string& name) const;
  // Resolves `name`, then throws dhp::Error naming the backends this build has when it is not
  // one of them.
  std::unique_ptr<Backend> make(const std::string& name, const BackendOptions& opt) const;
  std::vector<std::string> names() const;
  // The product name of device `ordinal` of backend `name` (resolved), or "" when the backend
  // does not say (the CPU).
  std::string device_name(const std::string& name, int ordinal) const;

 private:
  struct Entry {
    Factory make;
    Probe unusable;
    Describe describe;
  };
  std::map<std::string, Entry> factories_;
};

// The process's registry, with the CPU backend already in it.
BackendRegistry& backend_registry();
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& opt);

// This process's index among the ranks its launcher started on the node (Open MPI, MPICH and
// Slurm say so in the environment), or -1 when no launcher does: one device per rank.
int launcher_local_rank();

// The fp32 CPU reference backend (OpenBLAS + OpenMP).
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& opt);

// The compute threads to use when the configuration says 0: every core. Data workers mostly
// wait on a loaded machine's compute, so leaving them a core of their own halves the speed
// (measured: 2 threads + 1 worker run the demo 1.8x faster than 1 + 1 on 2 cores).
int default_compute_threads();

}  // namespace dhp
