// The drivers of the op table (tests/ops_table/op_table.h): the finite-difference check of the
// CPU reference's gradients, and any backend's ops against the CPU reference in a storage
// dtype, on the same inputs.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/expect_close.h"
#include "tests/grad_check.h"
#include "tests/ops_table/op_table.h"

namespace dhp::testing {

// Central differences of the case's loss (the forward pass alone, on fp32 CPU buffers) against
// the gradients its backward pass leaves.
inline void expect_gradients(const OpCase& c, const Ops& cpu) {
  ASSERT_TRUE(c.loss && !c.grads.empty()) << c.name() << " has no loss";
  std::vector<Tensor> inputs = c.tensors();
  HostBuffers ran(inputs, DType::F32);
  c.forward(cpu, ran.args());
  c.backward(cpu, ran.args());
  for (const Grad& g : c.grads) {
    const auto after = ran.values(g.grad);
    std::vector<float> analytic(after.size());
    const Tensor& before = ran.tensor(g.grad);
    for (size_t i = 0; i < after.size(); ++i)
      analytic[i] = float(after[i] - (g.accumulates ? before.f[i] : 0.0));
    size_t k = 0;
    while (inputs[k].name != g.input) ++k;
    // The loss reads the perturbed input afresh: new buffers from `inputs` on every call.
    auto loss = [&] {
      HostBuffers b(inputs, DType::F32);
      c.forward(cpu, b.args());
      return c.loss(b.args());
    };
    expect_gradient(c.name() + " d" + g.input, inputs[k].f, analytic, loss, g.probes);
  }
}

inline bool uses_storage(const std::vector<Tensor>& ts) {
  for (const Tensor& x : ts)
    if (x.kind == Kind::act) return true;
  return false;
}

// Where a backend's kernels run, for its tolerances.
enum class Side { device, emulated };

inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name(); }

// The name gtest shows for a row: its op and shape in letters, digits and underscores.
inline std::string test_name(const OpCase& c) {
  std::string s;
  for (char ch : c.name()) {
    if (std::isalnum(static_cast<unsigned char>(ch)))
      s += ch;
    else if (!s.empty() && s.back() != '_')
      s += '_';
  }
  return s;
}

// Runs the case on `ops` (buffers from `mem`, which may be the host) and on the CPU reference
// `ref` of the same storage dtype, from the same inputs, and compares every checked buffer.
inline void expect_matches_cpu(const OpCase& c, Backend& mem, const Ops& ops, const Ops& ref,
                               Side side) {
  const DType t = ops.dtype();
  ASSERT_EQ(ref.dtype(), t);
  HostBuffers host(c.tensors(), t);
  ASSERT_EQ(c.storage, uses_storage(host.tensors)) << c.name();
  std::vector<DeviceBuffer> dev;
  std::map<std::string, void*> ptrs;
  for (size_t i = 0; i < host.tensors.size(); ++i) {
    dev.emplace_back(mem, host.bytes[i].size());
    mem.upload(dev.back().data(), host.bytes[i].data(), host.bytes[i].size());
    ptrs[host.tensors[i].name] = dev.back().data();
  }
  const Args on_dev(t, ptrs);
  c.forward(ops, on_dev);
  if (c.backward) c.backward(ops, on_dev);
  c.forward(ref, host.args());
  if (c.backward) c.backward(ref, host.args());
  mem.synchronize();
  const char* where = side == Side::device ? "cuda" : "emulated";
  for (const Check& k : c.checks) {
    size_t i = 0;
    while (host.tensors[i].name != k.name) ++i;
    std::vector<uint8_t> got(host.bytes[i].size());
    mem.download(got.data(), dev[i].data(), got.size());
    const OpTol& tl = k.tol;
    const Tol tol = side == Side::device ? (t == DType::BF16 ? tl.device_bf16 : tl.device_f32)
                                         : (t == DType::BF16 ? tl.emulated_bf16 : tl.emulated_f32);
    expect_close(c.name() + " " + k.name + " " + dtype_name(t),
                 values_of(host.tensors[i], got.data(), t), host.values(k.name), tol, where);
  }
}

}  // namespace dhp::testing
