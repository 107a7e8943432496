// The CUDA attention kernels against the CPU reference (kernels/cpu/attention.h) on random
// packed batches: causal documents of uneven lengths, image blocks, GQA, a ring step's separate
// query and key metadata, rows that see nothing, every head dimension with an instance; the
// log-sum-exp merge against cpu::attention_merge, and a ring of two key chunks merged on the
// device against attention over all keys. Device memory is handled here directly. Skipped
// (and reported as skipped) where no CUDA device is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "tests/attention_cases.h"
#include "tests/storage_convert.h"

namespace dhp {
namespace {

using testing::AttnCase;
using testing::AttnData;
using testing::expect_close;
using testing::PackMeta;

// A device copy of a host vector, freed at scope exit.
template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    DHP_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(1, n_) * sizeof(T)));
    if (n_ > 0) DHP_CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    if (n_ > 0) DHP_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

struct DevMeta {
  Dev<int32_t> doc, idx, blk;
  explicit DevMeta(const PackMeta& m) : doc(m.doc), idx(m.idx), blk(m.blk) {}
  AttnMeta view() const { return {doc.get(), idx.get(), blk.get()}; }
};

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaStatus st = cuda_status();
    if (st.devices == 0) GTEST_SKIP() << "no CUDA device: " << st.reason;
  }
};

struct DeviceResults {
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward, then backward from the device's own forward results (as training runs it). T: the
// storage of the head vectors (float, or cuda::bf16 with the inputs already bf16 values).
template <class T = float>
DeviceResults run_on_device(const AttnCase& c, const AttnData& d,
                            cuda::AttnMath math = cuda::AttnMath::fp32) {
  using testing::stored;
  using testing::widened;
  const AttnShape& s = d.s;
  const DevMeta qm(c.qm), km(c.km);
  const Dev<T> q(stored<T>(d.q)), k(stored<T>(d.k)), v(stored<T>(d.v)),
      dout(stored<T>(d.dout));
  // Outputs start as garbage: everything must be written.
  auto garbage = [](size_t n) { return stored<T>(std::vector<float>(n, 7.0f)); };
  Dev<T> out(garbage(d.out.size()));
  Dev<float> lse(std::vector<float>(d.lse.size(), 7.0f));
  Dev<T> dq(garbage(d.dq.size())), dk(garbage(d.dk.size())), dv(garbage(d.dv.size()));
  cuda::attention_forward(nullptr, out.get(), lse.get(), q.get(), k.get(), v.get(), qm.view(),
                          km.view(), s, math);
  cuda::attention_backward(nullptr, dq.get(), dk.get(), dv.get(), dout.get(), out.get(), lse.get(),
                           q.get(), k.get(), v.get(), qm.view(), km.view(), s, math);
  DHP_CUDA_CHECK(cudaDeviceSynchronize());
  return {widened(out.host()), lse.host(), widened(dq.host()), widened(dk.host()),
          widened(dv.host())};
}

class CudaAttentionHeadDims : public CudaAttention, public ::testing::WithParamInterface<int> {};

template <class T = float>
void check_cases(int hd, cuda::AttnMath math, testing::AttnTolerance tol) {
  uint64_t seed = 300;
  for (const AttnCase& c : testing::attention_cases({hd}, 1500)) {
    SCOPED_TRACE(c.name);
    const AttnData d = testing::reference(c, seed++, std::is_same_v<T, cuda::bf16>);
    const DeviceResults r = run_on_device<T>(c, d, math);
    expect_close(c.name + " out", r.out, d.out, tol);
    expect_close(c.name + " lse", r.lse, d.lse, tol);
    expect_close(c.name + " dq", r.dq, d.dq, tol);
    expect_close(c.name + " dk", r.dk, d.dk, tol);
    expect_close(c.name + " dv", r.dv, d.dv, tol);
  }
}

TEST_P(CudaAttentionHeadDims, MatchesTheCpuReference) {
  check_cases(GetParam(), cuda::AttnMath::fp32, testing::kFp32Tol);
}

TEST_P(CudaAttentionHeadDims, Tf32MatchesTheCpuReference) {
  check_cases(GetParam(), cuda::AttnMath::tf32, testing::kTf32Tol);
}

// bf16 storage, always on tensor cores; the reference starts from the same bf16 inputs.
TEST_P(CudaAttentionHeadDims, Bf16StorageMatchesTheCpuReference) {
  check_cases<cuda::bf16>(GetParam(), cuda::AttnMath::tf32, testing::kBf16Tol);
}

INSTANTIATE_TEST_SUITE_P(All, CudaAttentionHeadDims, ::testing::Values(16, 32, 64, 80, 96, 128),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return "hd" + std::to_string(i.param);
                         });

// A long pack (4096 tokens, several causal documents, hd 128, GQA 2:1), and the same bits on
// a second run: no atomics, so nothing depends on scheduling. The TF32 variant on it too: its
// error must not grow with documents of 1500 tokens.
TEST_F(CudaAttention, LongPackAndRepeatable) {
  Rng rng(8);
  const PackMeta m = testing::random_pack(rng, 4096, 1500, false);
  const AttnCase c{"long pack", m, m, 4, 2, 128};
  const AttnData d = testing::reference(c, 9);
  const DeviceResults a = run_on_device(c, d), b = run_on_device(c, d);
  expect_close("out", a.out, d.out);
  expect_close("lse", a.lse, d.lse);
  expect_close("dq", a.dq, d.dq);
  expect_close("dk", a.dk, d.dk);
  expect_close("dv", a.dv, d.dv);
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
  const DeviceResults t = run_on_device(c, d, cuda::AttnMath::tf32);
  expect_close("tf32 out", t.out, d.out, testing::kTf32Tol);
  expect_close("tf32 dq", t.dq, d.dq, testing::kTf32Tol);
  expect_close("tf32 dk", t.dk, d.dk, testing::kTf32Tol);
  expect_close("tf32 dv", t.dv, d.dv, testing::kTf32Tol);
}

// The merge against the CPU's, with rows where either part or both saw nothing.
TEST_F(CudaAttention, MergeMatchesTheCpu) {
  Rng rng(10);
  const int64_t T = 333;
  const int H = 3, hd = 80;
  auto out = testing::random_vec(rng, size_t(T * H * hd)),
       part = testing::random_vec(rng, size_t(T * H * hd));
  auto lse = testing::random_vec(rng, size_t(T * H), 4.0f),
       plse = testing::random_vec(rng, size_t(T * H), 4.0f);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < lse.size(); i += 5) lse[i] = ninf;
  for (size_t i = 0; i < plse.size(); i += 7) plse[i] = ninf;
  Dev<float> dout(out), dlse(lse);
  const Dev<float> dpart(part), dplse(plse);
  cuda::attention_merge(nullptr, dout.get(), dlse.get(), dpart.get(), dplse.get(), T, H, hd);
  cpu::attention_merge(out.data(), lse.data(), part.data(), plse.data(), T, H, hd);
  expect_close("merged out", dout.host(), out);
  expect_close("merged lse", dlse.host(), lse);
}

// Ring attention's use: the keys in two chunks with their own metadata, each attended on the
// device and merged there, equal attention over all keys at once.
TEST_F(CudaAttention, TwoKeyChunksMergedEqualAllKeys) {
  Rng rng(12);
  const PackMeta m = testing::random_pack(rng, 700, 300, true);
  PackMeta a, b;
  for (int64_t i = 0; i < m.size(); ++i) {
    PackMeta& p = i < 380 ? a : b;
    p.doc.push_back(m.doc[size_t(i)]);
    p.idx.push_back(m.idx[size_t(i)]);
    p.blk.push_back(m.blk[size_t(i)]);
  }
  const AttnCase whole{"all keys", m, m, 4, 2, 64};
  const AttnData d = testing::reference(whole, 13);
  const AttnShape& s = d.s;
  std::vector<float> ka(d.k.begin(), d.k.begin() + 380 * s.Hkv * s.hd),
      kb(d.k.begin() + 380 * s.Hkv * s.hd, d.k.end());
  std::vector<float> va(d.v.begin(), d.v.begin() + 380 * s.Hkv * s.hd),
      vb(d.v.begin() + 380 * s.Hkv * s.hd, d.v.end());
  const DevMeta qm(m), am(a), bm(b);
  const Dev<float> q(d.q), dka(ka), dkb(kb), dva(va), dvb(vb);
  Dev<float> out(d.out), lse(d.lse), pout(d.out), plse(d.lse);
  AttnShape sa = s, sb = s;
  sa.Tk = a.size();
  sb.Tk = b.size();
  cuda::attention_forward(nullptr, out.get(), lse.get(), q.get(), dka.get(), dva.get(), qm.view(),
                          am.view(), sa);
  cuda::attention_forward(nullptr, pout.get(), plse.get(), q.get(), dkb.get(), dvb.get(), qm.view(),
                          bm.view(), sb);
  cuda::attention_merge(nullptr, out.get(), lse.get(), pout.get(), plse.get(), s.Tq, s.Hq, s.hd);
  expect_close("ring out", out.host(), d.out);
  expect_close("ring lse", lse.host(), d.lse);
}

// Checked before any device work, so this runs without a GPU too.
TEST(CudaAttentionShapes, UnsupportedHeadDimIsAnError) {
  const int32_t zero = 0;
  const AttnMeta m{&zero, &zero, &zero};
  float x = 0;
  EXPECT_THROW(
      cuda::attention_forward(nullptr, &x, &x, &x, &x, &x, m, m, AttnShape{1, 1, 1, 1, 48, 1.0f}),
      Error);
  EXPECT_THROW(cuda::attention_backward(nullptr, &x, &x, &x, &x, &x, &x, &x, &x, &x, m, m,
                                        AttnShape{1, 1, 1, 1, 24, 1.0f}),
               Error);
  EXPECT_THROW(
      cuda::attention_forward(nullptr, &x, &x, &x, &x, &x, m, m, AttnShape{1, 1, 3, 2, 64, 1.0f}),
      Error);
}

}  // namespace
}  // namespace dhp
