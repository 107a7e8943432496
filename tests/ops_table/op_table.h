// One table of op cases (in the manner of ggml's tests/test-backend-ops.cpp): each row names an
// op and its shapes, makes its inputs from a seed, calls the op interface (kernels/ops.h) once
// forward and once backward, and says which buffers to compare, with what tolerance per
// storage dtype, and which scalar loss checks its gradients. The same rows drive the
// finite-difference check of the CPU reference (tests/test_kernels.cpp), every backend and
// dtype against that reference (tests/test_cuda_kernels.cpp, tests/test_cuda_kernels_emulated.cpp)
// and the CPU bench (bench/bench_kernels.cpp). A new op is a row in op_cases.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/ops.h"
#include "tests/ops_table/tol.h"

namespace dhp::testing {

// How a buffer is stored on a backend and compared.
enum class Kind : uint8_t {
  act,    // activations and working weights: the ops' storage dtype (fp32 or bf16)
  f32,    // statistics, parameter gradients, optimizer state: fp32 in every precision
  f64,    // doubles (sum_squares, the cross-entropy statistics)
  bytes,  // ids, pixels, image tables: copied as they are
};

// One named buffer of a case and its initial host contents (fp32 values for act and f32; act
// values are rounded once where the storage is bf16).
struct Tensor {
  std::string name;
  Kind kind = Kind::f32;
  std::vector<float> f;    // act, f32
  std::vector<double> d;   // f64
  std::vector<uint8_t> b;  // bytes
  size_t count() const { return kind == Kind::f64 ? d.size() : kind == Kind::bytes ? b.size() : f.size(); }
};

// A comparison's bound |got - ref| <= atol + rtol·|ref| for each place a kernel runs (a device,
// or its body under the CPU thread emulator, tests/cuda_emulator.h) and each storage dtype.
// The constants in op_cases.cpp give each figure's reason.
struct OpTol {
  Tol device_f32, device_bf16, emulated_f32, emulated_bf16;
};

// What the ops see: the case's buffers on one backend, in its storage dtype.
class Args {
 public:
  Args(DType t, std::map<std::string, void*> ptrs) : t_(t), ptrs_(std::move(ptrs)) {}
  DType dtype() const { return t_; }
  Act act(const std::string& name) const { return Act(ptr(name), t_); }
  float* f32(const std::string& name) const { return static_cast<float*>(ptr(name)); }
  template <class T>
  T* as(const std::string& name) const {
    return static_cast<T*>(ptr(name));
  }
  void* ptr(const std::string& name) const;

 private:
  DType t_;
  std::map<std::string, void*> ptrs_;
};

using Call = std::function<void(const Ops&, const Args&)>;

// A buffer compared after the case ran (forward, then backward).
struct Check {
  std::string name;
  OpTol tol;
};

// The finite-difference check of one input: d loss / d input against the gradient buffer the
// backward pass leaves (its change, where the gradient accumulates).
struct Grad {
  std::string input, grad;
  bool accumulates = false;
  int probes = 40;  // coordinates probed, all of them when the input is smaller
};

struct OpCase {
  std::string op, shape;  // "rmsnorm", "T=5 C=7"
  // The inputs (and outputs' garbage) from a generator seeded by the case's name.
  std::function<std::vector<Tensor>(Rng&)> make;
  Call forward, backward;  // backward may be empty
  std::vector<Check> checks;
  // On the fp32 CPU reference, after `forward` alone: the scalar whose gradients `grads` are.
  std::function<double(const Args&)> loss;
  std::vector<Grad> grads;
  double flops_forward = 0, flops_backward = 0;  // nominal, for the bench
  // Whether any buffer is in the storage dtype; without one, the fp32 run covers every dtype.
  bool storage = true;
  std::string name() const { return op + " " + shape; }
  std::vector<Tensor> tensors() const;  // make, seeded from the name
};

// The rows, per use: small shapes for the finite-difference check; shapes of several sizes
// (odd ones, large vocabularies, grid-stride lengths) for a device; shapes that fill the
// kernels' blocks and tiles exactly and with tails, small enough for the emulator's fibers.
std::vector<OpCase> grad_cases();
std::vector<OpCase> device_cases();
std::vector<OpCase> emulated_cases();

// The model shapes bench/bench_kernels times, the pointwise ops of one model.
struct PerfShape {
  int64_t T, d, ffn, V;
  int H, hd;
  const int32_t* pos;  // (T) rope positions
};
std::vector<OpCase> perf_cases(const PerfShape& s);
// The Linear layer's GEMMs without a bias, the bench's yardstick.
OpCase linear_case(int64_t T, int64_t in, int64_t out);
// Self-attention over a pack with per-token metadata (kernels/cpu/attention.h) and `pairs`
// visible (query, key) pairs; `what` describes the pack. The attention tests have their own
// cases (tests/attention_cases.h: every head dimension and variant, ring steps).
OpCase attention_case(const std::string& what, const std::vector<int32_t>& doc,
                      const std::vector<int32_t>& idx, const std::vector<int32_t>& blk,
                      int64_t pairs, int Hq, int Hkv, int hd);

// ---- Building rows --------------------------------------------------------------------------

// Uniform in [-scale, scale].
std::vector<float> uniform(Rng& rng, size_t n, float scale = 1.0f);
Tensor act(std::string name, std::vector<float> v);
Tensor f32(std::string name, std::vector<float> v);
Tensor f64(std::string name, std::vector<double> v);
template <class T>
Tensor bytes(std::string name, const std::vector<T>& v) {
  Tensor t{std::move(name), Kind::bytes, {}, {}, {}};
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  t.b.assign(p, p + v.size() * sizeof(T));
  return t;
}
// An output the op must write in full: starts as garbage (7.0).
Tensor act_out(std::string name, size_t n);
Tensor f32_out(std::string name, size_t n);

// sum(y · r) in double over the two buffers of n elements: the loss whose gradient in y is r.
double weighted(const Args& a, const std::string& y, const std::string& r, size_t n);

// The host copy of a case's buffers in a storage dtype, and the pointers into it.
struct HostBuffers {
  std::vector<Tensor> tensors;
  std::vector<std::vector<uint8_t>> bytes;
  DType t = DType::F32;
  HostBuffers(std::vector<Tensor> ts, DType dtype);
  Args args();
  // Buffer `name` as fp32 (act and f32 widened from the storage) or doubles.
  std::vector<double> values(const std::string& name) const;
  const Tensor& tensor(const std::string& name) const;
};

// The values of tensor x read from its stored bytes p (another backend's copy of it).
std::vector<double> values_of(const Tensor& x, const uint8_t* p, DType t);

}  // namespace dhp::testing
