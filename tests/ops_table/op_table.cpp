#include "tests/ops_table/op_table.h"

#include <cstring>
#include <stdexcept>

#include "core/bf16.h"

namespace dhp::testing {

void* Args::ptr(const std::string& name) const {
  const auto it = ptrs_.find(name);
  if (it == ptrs_.end()) throw std::invalid_argument("op case has no buffer " + name);
  return it->second;
}

std::vector<float> uniform(Rng& rng, size_t n, float scale) {
  std::vector<float> v(n);
  for (auto& x : v) x = float((rng.uniform() * 2.0 - 1.0) * scale);
  return v;
}

Tensor act(std::string name, std::vector<float> v) {
  return Tensor{std::move(name), Kind::act, std::move(v), {}, {}};
}
Tensor f32(std::string name, std::vector<float> v) {
  return Tensor{std::move(name), Kind::f32, std::move(v), {}, {}};
}
Tensor f64(std::string name, std::vector<double> v) {
  return Tensor{std::move(name), Kind::f64, {}, std::move(v), {}};
}
Tensor act_out(std::string name, size_t n) { return act(std::move(name), std::vector<float>(n, 7.0f)); }
Tensor f32_out(std::string name, size_t n) { return f32(std::move(name), std::vector<float>(n, 7.0f)); }

double weighted(const Args& a, const std::string& y, const std::string& r, size_t n) {
  const float* py = a.f32(y);
  const float* pr = a.f32(r);
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += double(py[i]) * pr[i];
  return s;
}

std::vector<Tensor> OpCase::tensors() const {
  // FNV-1a of the name: each row its own inputs, the same on every run and backend.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name()) h = (h ^ c) * 1099511628211ull;
  Rng rng(h);
  return make(rng);
}

HostBuffers::HostBuffers(std::vector<Tensor> ts, DType dtype) : tensors(std::move(ts)), t(dtype) {
  for (const Tensor& x : tensors) {
    std::vector<uint8_t> b;
    if (x.kind == Kind::act && t == DType::BF16) {
      const auto r = round_to_bf16(x.f);
      b.resize(r.size() * 2);
      std::memcpy(b.data(), r.data(), b.size());
    } else if (x.kind == Kind::act || x.kind == Kind::f32) {
      b.resize(x.f.size() * 4);
      std::memcpy(b.data(), x.f.data(), b.size());
    } else if (x.kind == Kind::f64) {
      b.resize(x.d.size() * 8);
      std::memcpy(b.data(), x.d.data(), b.size());
    } else {
      b = x.b;
    }
    // A buffer is never empty, so that every name has a pointer.
    b.resize(b.size() + 16);
    bytes.push_back(std::move(b));
  }
}

Args HostBuffers::args() {
  std::map<std::string, void*> p;
  for (size_t i = 0; i < tensors.size(); ++i) p[tensors[i].name] = bytes[i].data();
  return Args(t, std::move(p));
}

const Tensor& HostBuffers::tensor(const std::string& name) const {
  for (const Tensor& x : tensors)
    if (x.name == name) return x;
  throw std::invalid_argument("op case has no buffer " + name);
}

std::vector<double> values_of(const Tensor& x, const uint8_t* p, DType t) {
  const size_t n = x.count();
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (x.kind == Kind::act && t == DType::BF16) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      v[i] = bf16_to_float(h);
    } else if (x.kind == Kind::act || x.kind == Kind::f32) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      v[i] = f;
    } else if (x.kind == Kind::f64) {
      std::memcpy(&v[i], p + 8 * i, 8);
    } else {
      v[i] = p[i];
    }
  }
  return v;
}

std::vector<double> HostBuffers::values(const std::string& name) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == name) return values_of(tensors[i], bytes[i].data(), t);
  throw std::invalid_argument("op case has no buffer " + name);
}

}  // namespace dhp::testing
