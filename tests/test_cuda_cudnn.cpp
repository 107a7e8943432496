// cuDNN's fused attention (kernels/cuda/cudnn_attention.h). On any machine with the library:
// every graph the trainer can ask for lowers to cuDNN backend descriptors that cuDNN itself
// accepts and finalizes (types, counts and ranks of every attribute). On a device: the cuDNN
// path against the CPU reference (kernels/cpu/attention.h) in bf16 for every head dimension on
// packed causal documents, images, ring blocks and the shared attention cases; and
// train.attention's choice (own, cudnn, auto with its agreement). Device tests are skipped
// (and reported as skipped) where no CUDA device is usable.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/attention_runs.h"
#include "kernels/cuda/attention_select.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/device.h"
#include "tests/attention_cases.h"
#include "tests/storage_convert.h"

namespace dhp {
namespace {

using cuda::sdpa::Pass;
using cuda::sdpa::ShapeClass;
using testing::AttnCase;
using testing::AttnData;
using testing::PackMeta;

// What the host can check of cuDNN's side: every descriptor and every operation graph
// finalizes (cuDNN's own checks of attribute types, operand shapes and the graph's
// connectivity). Planning needs a device: cuDNN's attention engines compile at run time,
// through the driver.
TEST(CudnnGraphs, EveryGraphLowersToDescriptorsCudnnAccepts) {
  int lowered = 0;
  for (Pass pass : {Pass::forward, Pass::backward})
    for (int hd : {16, 32, 64, 80, 96, 128})
      for (auto [Hq, Hkv] : {std::pair{4, 4}, std::pair{8, 2}})
        for (bool causal : {true, false}) {
          const ShapeClass c{pass, CUDNN_DATA_BFLOAT16, hd, Hq, Hkv, causal, 8, 512, causal ? 512 : 1024};
          SCOPED_TRACE(c.name());
          const cuda::sdpa::Graph g =
              pass == Pass::forward ? cuda::sdpa::forward_graph(c) : cuda::sdpa::backward_graph(c);
          const cuda::LoweredGraph l = cuda::lower(g);  // throws naming the attribute cuDNN refused
          EXPECT_EQ(l.tensors.size(), g.tensors.size());
          EXPECT_EQ(l.ops.size(), g.ops.size());
          // The graph as a whole too: cuDNN builds its DAG and checks it without a device.
          cuda::operation_graph(l, nullptr);
          ++lowered;
        }
  EXPECT_EQ(lowered, 48);
}

TEST(CudnnGraphs, UnavailableSaysWhy) {
  const std::string why = cuda::cudnn_unavailable();
  if (cuda_status().devices == 0)
    EXPECT_NE(why.find("no usable CUDA device"), std::string::npos) << why;
  else
    EXPECT_EQ(why, "");
}

// ---- on a device ------------------------------------------------------------------------------

class CudnnAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = cuda::cudnn_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
    BackendOptions o;
    o.precision = Precision::bf16;
    o.attention = AttentionImpl::cudnn;
    backend_ = make_cuda_backend(o);
  }
  std::unique_ptr<Backend> backend_;
};

struct Meta {
  DeviceBuffer doc, idx, blk;
  std::vector<AttnRun> runs;
  Meta(Backend& b, const PackMeta& m) {
    auto up = [&](const std::vector<int32_t>& v) {
      DeviceBuffer d(b, sizeof(int32_t) * std::max<size_t>(1, v.size()));
      b.upload(d.data(), v.data(), sizeof(int32_t) * v.size());
      return d;
    };
    doc = up(m.doc), idx = up(m.idx), blk = up(m.blk);
    attention_runs(runs, m.doc.data(), m.idx.data(), m.blk.data(), m.size());
  }
  AttnMeta view() const {
    return {doc.as<int32_t>(), idx.as<int32_t>(), blk.as<int32_t>(), AttnRuns{runs.data(), int64_t(runs.size())}};
  }
};

// Runs case c through cuDNN (forward, then backward from cuDNN's own output) and checks it
// against the CPU reference from the same bf16 inputs. False when cuDNN cannot take the call.
bool check_on_cudnn(Backend& backend, cuda::CudnnAttention& lib, const AttnCase& c, uint64_t seed) {
  using cuda::bf16;
  const AttnData d = testing::reference(c, seed, true);
  const AttnShape& s = d.s;
  const Meta qm(backend, c.qm), km(backend, c.km);
  ShapeClass cls;
  std::string why;
  if (!lib.classify(Pass::forward, DType::BF16, qm.view(), km.view(), s, &cls, &why)) return false;
  auto up = [&](const std::vector<float>& v) {
    const std::vector<bf16> h = testing::stored<bf16>(v);
    DeviceBuffer buf(backend, sizeof(bf16) * std::max<size_t>(1, h.size()));
    backend.upload(buf.data(), h.data(), sizeof(bf16) * h.size());
    return buf;
  };
  const std::vector<float> garbage_q(d.q.size(), 7.0f), garbage_k(d.k.size(), 7.0f);
  DeviceBuffer q = up(d.q), k = up(d.k), v = up(d.v), dout = up(d.dout), out = up(garbage_q), dq = up(garbage_q),
               dk = up(garbage_k), dv = up(garbage_k);
  DeviceBuffer lse(backend, sizeof(float) * size_t(s.Tq * s.Hq));
  const std::vector<float> seven(size_t(s.Tq * s.Hq), 7.0f);
  backend.upload(lse.data(), seven.data(), sizeof(float) * seven.size());
  auto a = [](const DeviceBuffer& b) { return Act(b.data(), DType::BF16); };
  EXPECT_TRUE(lib.forward(a(out), lse.as<float>(), a(q), a(k), a(v), qm.view(), km.view(), s));
  EXPECT_TRUE(lib.backward(a(dq), a(dk), a(dv), a(dout), a(out), lse.as<float>(), a(q), a(k), a(v), qm.view(),
                           km.view(), s));
  auto host = [&](const DeviceBuffer& b, size_t n) {
    std::vector<bf16> h(n);
    backend.download(h.data(), b.data(), sizeof(bf16) * n);
    return testing::widened(h);
  };
  std::vector<float> lse_h(seven.size());
  backend.download(lse_h.data(), lse.data(), sizeof(float) * lse_h.size());
  testing::expect_close(c.name + " out", host(out, d.out.size()), d.out, testing::kBf16Tol);
  testing::expect_close(c.name + " lse", lse_h, d.lse, testing::kBf16Tol);
  testing::expect_close(c.name + " dq", host(dq, d.dq.size()), d.dq, testing::kBf16Tol);
  testing::expect_close(c.name + " dk", host(dk, d.dk.size()), d.dk, testing::kBf16Tol);
  testing::expect_close(c.name + " dv", host(dv, d.dv.size()), d.dv, testing::kBf16Tol);
  return true;
}

// The layouts the trainer hands cuDNN, per head dimension: packed causal documents (GQA 4:1),
// images (full blocks, MHA), a ring block whose keys all precede its queries (full, rows of
// documents the keys lack see nothing).
std::vector<AttnCase> cudnn_cases(int hd) {
  Rng rng(77 + hd);
  std::vector<AttnCase> out;
  const std::string h = " hd=" + std::to_string(hd);
  const PackMeta docs = testing::random_pack(rng, 1500, 600, false);
  out.push_back({"packed documents" + h, docs, docs, 8, 2, hd});
  PackMeta images;
  for (int32_t im = 0; im < 5; ++im)
    for (int64_t p = 0, n = rng.range(16, 400); p < n; ++p) images.doc.push_back(im), images.idx.push_back(0), images.blk.push_back(im);
  out.push_back({"images" + h, images, images, 4, 4, hd});
  PackMeta later = testing::random_pack(rng, 700, 200, false, 0, 300);
  PackMeta earlier = testing::random_pack(rng, 500, 250, false, 0, 0);
  out.push_back({"ring block" + h, later, earlier, 4, 2, hd});
  return out;
}

TEST_F(CudnnAttentionTest, MatchesTheCpuReferenceOnEveryHeadDim) {
  cuda::CudnnAttention lib(*backend_, static_cast<cudaStream_t>(backend_->stream_handle()));
  uint64_t seed = 900;
  for (int hd : {16, 32, 64, 80, 96, 128})
    for (const AttnCase& c : cudnn_cases(hd)) {
      SCOPED_TRACE(c.name);
      EXPECT_TRUE(check_on_cudnn(*backend_, lib, c, seed++)) << "cuDNN refused " << c.name;
    }
  EXPECT_GT(lib.plans(), 0u);
}

// The shared cases of the own kernel's tests: whichever cuDNN takes, it gets right.
TEST_F(CudnnAttentionTest, SharedCasesItTakesAreRight) {
  cuda::CudnnAttention lib(*backend_, static_cast<cudaStream_t>(backend_->stream_handle()));
  int taken = 0, refused = 0;
  uint64_t seed = 1300;
  for (const AttnCase& c : testing::attention_cases({64, 128}, 1500)) {
    SCOPED_TRACE(c.name);
    (check_on_cudnn(*backend_, lib, c, seed++) ? taken : refused)++;
  }
  EXPECT_GT(taken, 4);
  EXPECT_GT(refused, 0);  // image blocks inside text, mixed ring blocks: the own kernel's
}

// train.attention: "cudnn" runs what cuDNN takes there; "auto" times both on a class's first
// call, runs the own kernel until the ranks agree, then the agreed choice.
TEST_F(CudnnAttentionTest, AutoTimesAgreesAndThenFollowsTheChoice) {
  BackendOptions o;
  o.precision = Precision::bf16;
  o.attention = AttentionImpl::automatic;
  auto backend = make_cuda_backend(o);
  const auto& ops = static_cast<const CudaOps&>(backend->ops());
  const AttnCase c = cudnn_cases(64)[0];
  const AttnData d = testing::reference(c, 5, true);
  const Meta qm(*backend, c.qm), km(*backend, c.km);
  DeviceBuffer q(*backend, 2 * d.q.size()), k(*backend, 2 * d.k.size()), v(*backend, 2 * d.v.size()),
      out(*backend, 2 * d.out.size()), lse(*backend, 4 * d.lse.size());
  backend->zero(q.data(), q.bytes()), backend->zero(k.data(), k.bytes()), backend->zero(v.data(), v.bytes());
  auto a = [](const DeviceBuffer& b) { return Act(b.data(), DType::BF16); };
  auto call = [&] { ops.attention_forward(a(out), lse.as<float>(), a(q), a(k), a(v), qm.view(), km.view(), d.s); };
  cuda::AttentionSelect& sel = ops.attention_select();
  call();
  call();
  EXPECT_EQ(sel.library_calls(), 0);  // timed, not yet agreed: own
  const std::vector<AttnTiming> t = backend->take_attention_timings();
  ASSERT_EQ(t.size(), 1u);
  EXPECT_GT(t[0].own_s, 0);
  EXPECT_GT(t[0].lib_s, 0);
  backend->agree_attention(t);
  call();
  const bool lib = t[0].lib_s < t[0].own_s;
  EXPECT_EQ(sel.library_calls(), lib ? 1 : 0);
  EXPECT_TRUE(backend->take_attention_timings().empty());
}

TEST(CudnnAttentionChoice, CudnnWithFp32StorageIsAClearError) {
  if (cuda_status().devices == 0) GTEST_SKIP() << "no CUDA device";
  BackendOptions o;
  o.precision = Precision::fp32;
  o.attention = AttentionImpl::cudnn;
  try {
    make_cuda_backend(o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.attention = \"cudnn\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dhp
