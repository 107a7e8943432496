// The operation graphs of cuDNN's fused attention (flash attention through cuDNN's runtime
// fusion engines), described as plain data: tensors with their dims, strides and types, and
// the ops between them, in the order and shapes cuDNN's engines recognise as scaled dot-product
// attention (the graphs NVIDIA's cudnn-frontend builds for its composite SDPA nodes). The
// description is host data only, so tests check it without a device; cudnn_attention.cpp
// lowers it to backend descriptors.
//
// Layout: every call is packed tokens, never padded. A call's batch entries are its segments
// (kernels/attention_runs.h: AttnPartition); tensor q (T, H, hd) is the logical [B, H, S, hd]
// with strides [S·H·hd, hd, H·hd, 1] and a ragged offset per entry (its first token times
// H·hd), with per-entry lengths in seq_len tensors (the padding mask). The softmax statistics
// are (T, Hq) the same way; dhp's lse is (Hq, T), transposed around the call.
#pragma once

#include <cudnn_graph.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention_runs.h"
#include "kernels/op_types.h"

namespace dhp::cuda::sdpa {

enum class Pass : uint8_t { forward, backward };

// What a graph and its plan are made for. Lengths are bucketed (shape_class) so that a run
// meets a few classes, not one per batch: entries past a call's segments have length 0.
struct ShapeClass {
  Pass pass = Pass::forward;
  cudnnDataType_t io = CUDNN_DATA_BFLOAT16;  // q, k, v, out and gradients: bf16 or fp16
  int hd = 0, Hq = 0, Hkv = 0;
  bool causal = false;                       // causal diagonals, else full blocks
  int64_t batch = 0, sq = 0, skv = 0;        // entries, longest query and key segment
  bool operator==(const ShapeClass&) const = default;
  std::string name() const;
};

struct ShapeClassHash {
  size_t operator()(const ShapeClass& c) const;
};

// The smallest power of two >= n, and at least `floor`.
int64_t bucket(int64_t n, int64_t floor);
// The class of a call of shape s that partition p runs (p.ok).
ShapeClass shape_class(Pass pass, cudnnDataType_t io, const AttnShape& s, const AttnPartition& p);

// Unique ids of the tensors a caller binds (the variant pack); virtual tensors take ids from
// kFirstVirtual on, the by-value -inf constants from kNegInf on.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  kScale,          // softmax scale, fp32 by value
  kSeqQ, kSeqKV,   // (B) int32 lengths
  kOffQ, kOffK, kOffStats,  // (B + 1) int64 element offsets: of q, o and their gradients; of
                            // k, v and theirs; of the statistics
  kSoftmaxSum,     // backward: rowsum(dO·O), fp32 (T, Hq), the caller's scratch
  kDQAccum,        // backward: dQ in fp32 (T, Hq, hd), the caller's scratch
  kOne,            // 1.0f by value
  kNegInf = 64,    // -inf by value, one per masked select
  kFirstVirtual = 128,
};

struct Tensor {
  int64_t uid = 0;
  std::array<int64_t, 4> dims{}, strides{};
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  bool is_virtual = false, by_value = false;
  int64_t ragged = 0;  // uid of the tensor of its ragged offsets; 0: none
};

enum class OpKind : uint8_t { matmul, pointwise, reduction, reshape };

struct Op {
  OpKind kind = OpKind::pointwise;
  cudnnPointwiseMode_t mode = CUDNN_POINTWISE_IDENTITY;  // pointwise
  cudnnReduceTensorOp_t reduce = CUDNN_REDUCE_TENSOR_ADD;  // reduction
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;  // pointwise math precision
  int64_t axis = -1;                        // GEN_INDEX: the dimension indexed
  // pointwise: x, b (second input), t (select mask), y; matmul: a = x, b, c = y; reduction and
  // reshape: x, y.
  int64_t x = 0, b = 0, t = 0, y = 0;
  int64_t m_override = 0, n_override = 0, k_override = 0;  // matmul: seq_len tensors
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Op> ops;  // in order: every input is a bound tensor or an earlier op's output
  const Tensor& tensor(int64_t uid) const;
  // The non-virtual tensors: every one needs a pointer at execution (by-value: a host one).
  std::vector<int64_t> bound() const;
};

Graph forward_graph(const ShapeClass& c);
Graph backward_graph(const ShapeClass& c);

}  // namespace dhp::cuda::sdpa
