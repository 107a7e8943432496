// cuDNN's fused attention (scaled dot-product attention through cuDNN's graph API) beside the
// backend's own kernel. A call runs here when the host knows its mask as runs
// (AttnMeta::runs) and those pair into per-sequence batch entries of one kind
// (kernels/attention_runs.h: packed documents, causal; images, full; ring blocks that are
// either), in bf16 or fp16 storage; otherwise forward() and backward() return false and the
// caller runs its own kernel.
//
// The graphs (sdpa_graph.h) are lowered to cuDNN backend descriptors by a small wrapper of
// our own (no cudnn-frontend), planned with cuDNN's heuristics once per shape class, and kept
// in a bounded cache. Scratch (the transposed statistics, the backward's fp32 dQ and row sums,
// the plans' workspace, the per-call tables of lengths and offsets) comes from one arena of
// the backend that grows to the largest call and then stays: no allocation in the steady
// state.
#pragma once

#include <cudnn_graph.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/lru_cache.h"
#include "kernels/cuda/sdpa_graph.h"

namespace dhp::cuda {

// One cuDNN backend descriptor, owned.
class CudnnDesc {
 public:
  CudnnDesc() = default;
  explicit CudnnDesc(cudnnBackendDescriptorType_t type);
  ~CudnnDesc();
  CudnnDesc(CudnnDesc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  CudnnDesc& operator=(CudnnDesc&& o) noexcept;
  CudnnDesc(const CudnnDesc&) = delete;
  CudnnDesc& operator=(const CudnnDesc&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  template <class T>
  CudnnDesc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                 const T* values, int64_t count = 1) {
    DHP_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, values));
    return *this;
  }
  CudnnDesc& set_desc(cudnnBackendAttributeName_t name, const CudnnDesc& d);
  void finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A graph lowered to finalized tensor and operation descriptors. Needs no device: tests lower
// every graph on the host, which checks every attribute cuDNN takes before a GPU sees it.
struct LoweredGraph {
  std::vector<std::pair<int64_t, CudnnDesc>> tensors;  // by uid, ragged offsets first
  std::vector<CudnnDesc> ops;                          // in the graph's order
  const CudnnDesc& tensor(int64_t uid) const;
};
LoweredGraph lower(const sdpa::Graph& g);
// The finalized operation graph of a lowered graph. `handle` may be null: cuDNN checks the
// graph (connectivity, shapes) without a device, which tests use on the host.
CudnnDesc operation_graph(const LoweredGraph& g, cudnnHandle_t handle);

// Why cuDNN cannot run here ("" when it can): the library's version, or no device.
std::string cudnn_unavailable();

class CudnnAttention {
 public:
  // Plans are kept for up to `capacity` shape classes.
  CudnnAttention(Backend& backend, cudaStream_t stream, size_t capacity = 64);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // The shape class the call would run as, or why it cannot run here (`why`); `part`, when
  // given, receives the call's partition into batch entries.
  bool classify(sdpa::Pass pass, DType t, const AttnMeta& qm, const AttnMeta& km,
                const AttnShape& s, sdpa::ShapeClass* cls, std::string* why,
                AttnPartition* part = nullptr) const;

  // Semantics of Ops::attention_forward / attention_backward. False: not run (the call's mask
  // or storage is not one cuDNN takes, or cuDNN has no engine for its class); nothing written.
  bool forward(Act out, float* lse, CAct q, CAct k, CAct v, const AttnMeta& qm,
               const AttnMeta& km, const AttnShape& s);
  bool backward(Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q, CAct k,
                CAct v, const AttnMeta& qm, const AttnMeta& km, const AttnShape& s);

  size_t plans() const { return cache_.size(); }
  size_t evictions() const { return cache_.evictions(); }

 private:
  struct Plan;
  struct Tables;
  // The plan of a class, built on first use; null when cuDNN has no engine for it.
  const Plan* plan(const sdpa::ShapeClass& c);
  // The lengths and offsets of a partition on the device.
  const Tables& tables(const AttnPartition& p, const sdpa::ShapeClass& c);
  // False (logged, the class marked failed) when cuDNN refuses to run the plan.
  bool execute(const Plan& plan, const std::vector<std::pair<int64_t, void*>>& ptrs, void* workspace);
  void launch(const Plan& plan, const std::vector<std::pair<int64_t, void*>>& ptrs, void* workspace);

  Backend& backend_;
  cudaStream_t stream_;
  int sm_major_ = 0;  // the device's compute capability
  cudnnHandle_t handle_ = nullptr;
  std::unordered_set<sdpa::ShapeClass, sdpa::ShapeClassHash> failed_;  // refused at launch
  LruCache<sdpa::ShapeClass, std::shared_ptr<Plan>, sdpa::ShapeClassHash> cache_;
  std::vector<std::unique_ptr<Tables>> tables_;  // most recent first, a few
  Arena scratch_;
};

}  // namespace dhp::cuda
