#include "kernels/cuda/cudnn_attention.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "kernels/attention_runs.h"
#include "kernels/cuda/attention_checks.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/launch.h"

namespace dhp::cuda {

// ---- descriptors ------------------------------------------------------------------------------

CudnnDesc::CudnnDesc(cudnnBackendDescriptorType_t type) {
  DHP_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
}

CudnnDesc::~CudnnDesc() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

CudnnDesc& CudnnDesc::operator=(CudnnDesc&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    o.d_ = nullptr;
  }
  return *this;
}

CudnnDesc& CudnnDesc::set_desc(cudnnBackendAttributeName_t name, const CudnnDesc& d) {
  cudnnBackendDescriptor_t p = d.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, &p);
}

void CudnnDesc::finalize() { DHP_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

const CudnnDesc& LoweredGraph::tensor(int64_t uid) const {
  for (const auto& [u, d] : tensors)
    if (u == uid) return d;
  throw Error(fmt::format("cuDNN graph: no tensor {}", uid));
}

namespace {

CudnnDesc lower_tensor(const sdpa::Tensor& t, const LoweredGraph& done) {
  CudnnDesc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t alignment = 16;
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &t.type)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, t.dims.data(), 4)
      .set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, t.strides.data(), 4)
      .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &t.uid)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &alignment);
  const bool yes = true;
  if (t.is_virtual) d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &yes);
  if (t.by_value) d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &yes);
  if (t.ragged) d.set_desc(CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, done.tensor(t.ragged));
  d.finalize();
  return d;
}

CudnnDesc lower_op(const sdpa::Op& op, const LoweredGraph& g) {
  using sdpa::OpKind;
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  switch (op.kind) {
    case OpKind::matmul: {
      CudnnDesc mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
      mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32).finalize();
      CudnnDesc d(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
      d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, g.tensor(op.x))
          .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, g.tensor(op.b))
          .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, g.tensor(op.y))
          .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
      if (op.m_override) d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, g.tensor(op.m_override));
      if (op.n_override) d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, g.tensor(op.n_override));
      if (op.k_override) d.set_desc(CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, g.tensor(op.k_override));
      d.finalize();
      return d;
    }
    case OpKind::pointwise: {
      CudnnDesc pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
      pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &op.mode)
          .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &op.prec);
      if (op.axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &op.axis);
      pw.finalize();
      CudnnDesc d(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
      d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
          .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, g.tensor(op.x))
          .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, g.tensor(op.y));
      if (op.b) d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, g.tensor(op.b));
      if (op.t) d.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, g.tensor(op.t));
      d.finalize();
      return d;
    }
    case OpKind::reduction: {
      CudnnDesc r(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
      const bool deterministic = false;
      r.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &f32)
          .set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &op.reduce)
          .set(CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, &deterministic)
          .finalize();
      CudnnDesc d(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
      d.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r)
          .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, g.tensor(op.x))
          .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, g.tensor(op.y))
          .finalize();
      return d;
    }
    case OpKind::reshape: {
      CudnnDesc d(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
      d.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, g.tensor(op.x))
          .set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, g.tensor(op.y))
          .finalize();
      return d;
    }
  }
  unreachable("every op kind is lowered above");
}

}  // namespace

LoweredGraph lower(const sdpa::Graph& g) {
  LoweredGraph out;
  // Offset tensors first: ragged tensors point at them.
  for (const sdpa::Tensor& t : g.tensors)
    if (!t.ragged) out.tensors.emplace_back(t.uid, lower_tensor(t, out));
  for (const sdpa::Tensor& t : g.tensors)
    if (t.ragged) out.tensors.emplace_back(t.uid, lower_tensor(t, out));
  for (const sdpa::Op& op : g.ops) out.ops.push_back(lower_op(op, out));
  return out;
}

CudnnDesc operation_graph(const LoweredGraph& g, cudnnHandle_t handle) {
  CudnnDesc og(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const CudnnDesc& d : g.ops) ops.push_back(d.get());
  og.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops.data(), int64_t(ops.size()));
  if (handle) og.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &handle);
  og.finalize();
  return og;
}

std::string cudnn_unavailable() {
  // The graphs are those cuDNN 9.10.2 and later take: -inf constants, one padding mask in the
  // backward pass, GQA on packed tensors (older 9.x wanted other graphs; 9.10.0/1 had a broken
  // backward). A later major changed the graph API.
  const size_t v = cudnnGetVersion();
  if (v < 91002 || v / 10000 != CUDNN_MAJOR)
    return fmt::format("cuDNN {} is loaded; dhp's attention graphs need cuDNN 9.10.2 or a later 9.x", v);
  const CudaStatus st = cuda_status();
  if (st.devices == 0) return fmt::format("no usable CUDA device ({})", st.reason);
  return "";
}

// ---- plans ------------------------------------------------------------------------------------

struct CudnnAttention::Plan {
  sdpa::ShapeClass cls;
  sdpa::Graph graph;
  LoweredGraph lowered;
  CudnnDesc op_graph, engine_config, plan;  // the plan refers to its configuration: kept
  int64_t workspace = 0;
};

struct CudnnAttention::Tables {
  std::vector<AttnSegment> segs;
  int64_t batch = 0, q_stride = 0, k_stride = 0, Hq = 0;
  DeviceBuffer buf;
  int64_t *off_q = nullptr, *off_k = nullptr, *off_stats = nullptr;
  int32_t *seq_q = nullptr, *seq_kv = nullptr;
};

namespace {

constexpr size_t kTableSlots = 8;

// The first engine configuration cuDNN's heuristics rank that makes a plan: mode A, then the
// fallback list. Null when none does.
bool make_plan(cudnnHandle_t handle, const CudnnDesc& op_graph, CudnnDesc* config, CudnnDesc* plan,
               std::string* why) {
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    CudnnDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendDescriptor_t og = op_graph.get();
    heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &og)
        .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) continue;
    int64_t n = 0;
    DHP_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr));
    std::vector<CudnnDesc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < n; ++i) {
      cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      raw.push_back(cfgs.back().get());
    }
    int64_t got = 0;
    if (n > 0)
      DHP_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                               CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, raw.data()));
    for (int64_t i = 0; i < got; ++i) {
      CudnnDesc p(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      p.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &handle)
          .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw[size_t(i)]);
      if (cudnnBackendFinalize(p.get()) == CUDNN_STATUS_SUCCESS) {
        *config = std::move(cfgs[size_t(i)]);
        *plan = std::move(p);
        return true;
      }
    }
  }
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  *why = detail[0] ? detail : "no engine configuration finalized";
  return false;
}

}  // namespace

CudnnAttention::CudnnAttention(Backend& backend, cudaStream_t stream, size_t capacity)
    : backend_(backend), stream_(stream), cache_(capacity), scratch_(backend) {
  int device = 0;
  DHP_CUDA_CHECK(cudaGetDevice(&device));
  DHP_CUDA_CHECK(cudaDeviceGetAttribute(&sm_major_, cudaDevAttrComputeCapabilityMajor, device));
  DHP_CUDNN_CHECK(cudnnCreate(&handle_));
  DHP_CUDNN_CHECK(cudnnSetStream(handle_, stream_));
}

CudnnAttention::~CudnnAttention() {
  // Plans and scratch may still be in use by queued work, and plans refer to the handle: the
  // stream drains, the plans go, then the handle.
  cudaStreamSynchronize(stream_);
  cache_.clear();
  tables_.clear();
  if (handle_) cudnnDestroy(handle_);
}

const CudnnAttention::Plan* CudnnAttention::plan(const sdpa::ShapeClass& c) {
  // An evicted plan's kernels may still be queued: drain first (rare: a cache miss when full).
  if (!cache_.find(c) && cache_.size() == cache_.capacity()) DHP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return cache_
      .get(c,
           [&]() -> std::shared_ptr<Plan> {
             auto p = std::make_shared<Plan>();
             p->cls = c;
             std::string why;
             try {
               p->graph = c.pass == sdpa::Pass::forward ? sdpa::forward_graph(c) : sdpa::backward_graph(c);
               p->lowered = lower(p->graph);
               p->op_graph = operation_graph(p->lowered, handle_);
               if (make_plan(handle_, p->op_graph, &p->engine_config, &p->plan, &why))
                 DHP_CUDNN_CHECK(cudnnBackendGetAttribute(p->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                          CUDNN_TYPE_INT64, 1, nullptr, &p->workspace));
             } catch (const Error& e) {
               why = e.what();
             }
             if (!why.empty()) {
               // Kept as "no plan", so the class is not retried at every call.
               spdlog::warn("cuDNN attention: no engine for {} ({}); dhp's own kernel runs it", c.name(), why);
               return nullptr;
             }
             return p;
           })
      .get();
}

const CudnnAttention::Tables& CudnnAttention::tables(const AttnPartition& p, const sdpa::ShapeClass& c) {
  const int64_t q_stride = int64_t(c.Hq) * c.hd, k_stride = int64_t(c.Hkv) * c.hd;
  for (size_t i = 0; i < tables_.size(); ++i) {
    Tables& t = *tables_[i];
    if (t.segs == p.segs && t.batch == c.batch && t.q_stride == q_stride && t.k_stride == k_stride &&
        t.Hq == c.Hq) {
      std::rotate(tables_.begin(), tables_.begin() + int64_t(i), tables_.begin() + int64_t(i) + 1);
      return *tables_.front();
    }
  }
  // The least recently used slot takes the new tables; slots keep their buffers.
  if (tables_.size() < kTableSlots) tables_.push_back(std::make_unique<Tables>());
  std::rotate(tables_.begin(), tables_.end() - 1, tables_.end());
  Tables& t = *tables_.front();
  t.segs = p.segs, t.batch = c.batch, t.q_stride = q_stride, t.k_stride = k_stride, t.Hq = c.Hq;
  const int64_t B = c.batch;
  // Entries past the segments are empty: length 0 at the end of the tokens.
  std::vector<int64_t> offs(size_t(3 * (B + 1)));
  std::vector<int32_t> lens(size_t(2 * B), 0);
  int64_t q_end = 0, k_end = 0;
  for (const AttnSegment& s : p.segs) q_end = std::max(q_end, s.q_start + s.q_len), k_end = std::max(k_end, s.k_start + s.k_len);
  for (int64_t b = 0; b <= B; ++b) {
    const bool real = b < int64_t(p.segs.size());
    const int64_t q0 = real ? p.segs[size_t(b)].q_start : q_end, k0 = real ? p.segs[size_t(b)].k_start : k_end;
    offs[size_t(b)] = q0 * q_stride;
    offs[size_t(B + 1 + b)] = k0 * k_stride;
    offs[size_t(2 * (B + 1) + b)] = q0 * c.Hq;
    if (b < B && real) {
      lens[size_t(b)] = int32_t(p.segs[size_t(b)].q_len);
      lens[size_t(B + b)] = int32_t(p.segs[size_t(b)].k_len);
    }
  }
  // Five tables, each on its own 256-byte boundary: the tensors are declared 16-byte aligned.
  auto round = [](size_t n) { return (n + 255) & ~size_t(255); };
  const size_t offs_bytes = round(sizeof(int64_t) * size_t(B + 1)), lens_bytes = round(sizeof(int32_t) * size_t(B));
  const size_t bytes = 3 * offs_bytes + 2 * lens_bytes;
  if (t.buf.bytes() < bytes) t.buf = DeviceBuffer(backend_, bytes);
  char* base = t.buf.as<char>();
  for (int i = 0; i < 3; ++i)
    backend_.upload(base + size_t(i) * offs_bytes, offs.data() + i * (B + 1), sizeof(int64_t) * size_t(B + 1));
  for (int i = 0; i < 2; ++i)
    backend_.upload(base + 3 * offs_bytes + size_t(i) * lens_bytes, lens.data() + i * B, sizeof(int32_t) * size_t(B));
  t.off_q = reinterpret_cast<int64_t*>(base);
  t.off_k = reinterpret_cast<int64_t*>(base + offs_bytes);
  t.off_stats = reinterpret_cast<int64_t*>(base + 2 * offs_bytes);
  t.seq_q = reinterpret_cast<int32_t*>(base + 3 * offs_bytes);
  t.seq_kv = reinterpret_cast<int32_t*>(base + 3 * offs_bytes + lens_bytes);
  return t;
}

bool CudnnAttention::classify(sdpa::Pass pass, DType t, const AttnMeta& qm, const AttnMeta& km,
                              const AttnShape& s, sdpa::ShapeClass* cls, std::string* why,
                              AttnPartition* part) const {
  auto no = [&](std::string w) {
    if (why) *why = std::move(w);
    return false;
  };
  if (t != DType::BF16) return no("cuDNN's fused attention stores bf16; this run stores fp32");
  if (s.Tq == 0 || s.Tk == 0) return no("an empty call");
  if ((qm.runs.n == 0) || (km.runs.n == 0)) return no("the caller gave no runs of its tokens");
  if (s.hd % 8 != 0 || s.hd > 256 || s.Hkv <= 0 || s.Hq % s.Hkv != 0)
    return no(fmt::format("head dimension {} with {}/{} heads", s.hd, s.Hq, s.Hkv));
  if (pass == sdpa::Pass::backward) {
    // The backward graph's packed fp32 dQ and packed statistics: head dimensions that are
    // multiples of 16 only (cuDNN has a known fault otherwise), on Hopper and Blackwell only
    // (not on sm 8.x / 12.x), up to 128 off Hopper.
    if (s.hd % 16 != 0) return no(fmt::format("backward with head dimension {} (not a multiple of 16)", s.hd));
    if (sm_major_ != 9 && sm_major_ != 10)
      return no(fmt::format("backward on packed tensors on a compute capability {}.x device", sm_major_));
    if (sm_major_ != 9 && s.hd > 128) return no(fmt::format("backward with head dimension {} off Hopper", s.hd));
  }
  AttnPartition p = partition_attention(qm.runs, km.runs);
  if (!p.ok) return no(p.why);
  if (p.segs.empty()) return no("no query sees a key");
  *cls = sdpa::shape_class(pass, CUDNN_DATA_BFLOAT16, s, p);
  if (failed_.count(*cls)) return no(fmt::format("cuDNN failed on {} before", cls->name()));
  if (part) *part = std::move(p);
  return true;
}

bool CudnnAttention::execute(const Plan& plan, const std::vector<std::pair<int64_t, void*>>& ptrs,
                             void* workspace) {
  try {
    launch(plan, ptrs, workspace);
    return true;
  } catch (const Error& e) {
    // Refused at launch: the class goes to the own kernel from now on, which writes every
    // output this call was to write.
    spdlog::warn("cuDNN attention: {} failed to run ({}); dhp's own kernel runs it", plan.cls.name(), e.what());
    failed_.insert(plan.cls);
    return false;
  }
}

void CudnnAttention::launch(const Plan& plan, const std::vector<std::pair<int64_t, void*>>& ptrs,
                            void* workspace) {
  // Host values of the by-value tensors: cuDNN reads them at execution.
  static const float kOneValue = 1.0f, kNegInfValue = -std::numeric_limits<float>::infinity();
  std::vector<int64_t> uids;
  std::vector<void*> data;
  for (const int64_t uid : plan.graph.bound()) {
    void* p = nullptr;
    if (uid >= sdpa::kNegInf && uid < sdpa::kFirstVirtual)
      p = const_cast<float*>(&kNegInfValue);
    else if (uid == sdpa::kOne)
      p = const_cast<float*>(&kOneValue);
    else
      for (const auto& [u, q] : ptrs)
        if (u == uid) p = q;
    DHP_ASSERT(p != nullptr);
    uids.push_back(uid);
    data.push_back(p);
  }
  CudnnDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids.data(), int64_t(uids.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, data.data(), int64_t(data.size()))
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, &workspace);
  pack.finalize();
  DHP_CUDNN_CHECK(cudnnBackendExecute(handle_, plan.plan.get(), pack.get()));
}

bool CudnnAttention::forward(Act out, float* lse, CAct q, CAct k, CAct v, const AttnMeta& qm,
                             const AttnMeta& km, const AttnShape& s) {
  sdpa::ShapeClass c;
  AttnPartition p;
  if (!classify(sdpa::Pass::forward, out.t, qm, km, s, &c, nullptr, &p)) return false;
  const Plan* pl = plan(c);
  if (!pl) return false;
  const Tables& t = tables(p, c);
  // The statistics as cuDNN writes them, (Tq, Hq), with a tile of slack past the last row.
  float* stats = nullptr;
  void* ws = nullptr;
  scratch_.carve([&](Carver& cv) {
    stats = cv.take<float>((s.Tq + 64) * s.Hq);
    ws = cv.take<char>(pl->workspace);
  });
  float scale = s.scale;
  // Rows in no segment see no key: out = 0, lse = -inf, as the own kernel leaves them.
  if (p.q_covered < s.Tq) {
    backend_.zero(out.p, dtype_size(out.t) * size_t(s.Tq * s.Hq * s.hd));
    fill<float>(stream_, stats, -INFINITY, s.Tq * s.Hq);
  }
  if (!execute(*pl,
               {{sdpa::kQ, const_cast<void*>(q.p)}, {sdpa::kK, const_cast<void*>(k.p)},
                {sdpa::kV, const_cast<void*>(v.p)}, {sdpa::kO, out.p}, {sdpa::kStats, stats},
                {sdpa::kScale, &scale}, {sdpa::kSeqQ, t.seq_q}, {sdpa::kSeqKV, t.seq_kv},
                {sdpa::kOffQ, t.off_q}, {sdpa::kOffK, t.off_k}, {sdpa::kOffStats, t.off_stats}},
               ws))
    return false;
  transpose(stream_, lse, stats, s.Tq, s.Hq);
  return true;
}

bool CudnnAttention::backward(Act dq, Act dk, Act dv, CAct dout, CAct out, const float* lse, CAct q,
                              CAct k, CAct v, const AttnMeta& qm, const AttnMeta& km, const AttnShape& s) {
  sdpa::ShapeClass c;
  AttnPartition p;
  if (!classify(sdpa::Pass::backward, dq.t, qm, km, s, &c, nullptr, &p)) return false;
  const Plan* pl = plan(c);
  if (!pl) return false;
  const Tables& t = tables(p, c);
  float *stats = nullptr, *row_sum = nullptr, *dq_acc = nullptr;
  void* ws = nullptr;
  scratch_.carve([&](Carver& cv) {
    stats = cv.take<float>((s.Tq + 64) * s.Hq);
    row_sum = cv.take<float>((s.Tq + 64) * s.Hq);
    dq_acc = cv.take<float>((s.Tq + 64) * s.Hq * s.hd);
    ws = cv.take<char>(pl->workspace);
  });
  float scale = s.scale;
  transpose(stream_, stats, lse, s.Hq, s.Tq);
  // Gradients of tokens in no segment are 0; cuDNN writes the segments' rows only.
  if (p.q_covered < s.Tq) backend_.zero(dq.p, dtype_size(dq.t) * size_t(s.Tq * s.Hq * s.hd));
  if (p.k_covered < s.Tk) {
    backend_.zero(dk.p, dtype_size(dk.t) * size_t(s.Tk * s.Hkv * s.hd));
    backend_.zero(dv.p, dtype_size(dv.t) * size_t(s.Tk * s.Hkv * s.hd));
  }
  return execute(*pl,
                 {{sdpa::kQ, const_cast<void*>(q.p)}, {sdpa::kK, const_cast<void*>(k.p)},
                  {sdpa::kV, const_cast<void*>(v.p)}, {sdpa::kO, const_cast<void*>(out.p)},
                  {sdpa::kDO, const_cast<void*>(dout.p)}, {sdpa::kStats, stats}, {sdpa::kDQ, dq.p},
                  {sdpa::kDK, dk.p}, {sdpa::kDV, dv.p}, {sdpa::kScale, &scale}, {sdpa::kSeqQ, t.seq_q},
                  {sdpa::kSeqKV, t.seq_kv}, {sdpa::kOffQ, t.off_q}, {sdpa::kOffK, t.off_k},
                  {sdpa::kOffStats, t.off_stats}, {sdpa::kSoftmaxSum, row_sum}, {sdpa::kDQAccum, dq_acc}},
                 ws);
}

}  // namespace dhp::cuda
