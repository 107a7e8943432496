#include "kernels/cuda/attention_select.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "kernels/cuda/check.h"

namespace dhp::cuda {

AttentionSelect::AttentionSelect(AttentionImpl mode, std::unique_ptr<CudnnAttention> lib,
                                 cudaStream_t stream)
    : mode_(mode), lib_(std::move(lib)), stream_(stream) {
  if (lib_ && mode_ == AttentionImpl::automatic) {
    DHP_CUDA_CHECK(cudaEventCreate(&start_));
    DHP_CUDA_CHECK(cudaEventCreate(&stop_));
  }
}

AttentionSelect::~AttentionSelect() {
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
}

AttentionSelect::Key AttentionSelect::key_of(const sdpa::ShapeClass& c) {
  return {int64_t(c.pass), int64_t(c.io), c.hd, c.Hq, c.Hkv, int64_t(c.causal), c.batch, c.sq, c.skv};
}

double AttentionSelect::seconds(const std::function<void()>& f) {
  f();
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < 3; ++r) {
    DHP_CUDA_CHECK(cudaEventRecord(start_, stream_));
    f();
    DHP_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    DHP_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    DHP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    best = std::min(best, 1e-3 * double(ms));
  }
  return best;
}

void AttentionSelect::run(sdpa::Pass pass, DType t, const AttnMeta& qm, const AttnMeta& km,
                          const AttnShape& s, const std::function<void()>& own,
                          const std::function<bool()>& lib) {
  auto run_own = [&] {
    own();
    ++own_calls_;
  };
  if (mode_ == AttentionImpl::own || !lib_) return run_own();
  sdpa::ShapeClass c;
  std::string why;
  if (!lib_->classify(pass, t, qm, km, s, &c, &why)) {
    // Said once per reason: a run meets the same few (fp32 storage, mixed ring blocks).
    if (told_.insert(why).second)
      spdlog::info("attention: dhp's own kernel where cuDNN cannot take the call: {}", why);
    return run_own();
  }
  if (mode_ == AttentionImpl::cudnn) {
    if (lib()) {
      ++lib_calls_;
      return;
    }
    return run_own();
  }
  const Key k = key_of(c);
  if (auto it = agreed_.find(k); it != agreed_.end()) {
    if (it->second && lib()) {
      ++lib_calls_;
      return;
    }
    return run_own();
  }
  if (timed_.insert(k).second) {
    bool ran = true;
    const double lib_s = seconds([&] { ran = ran && lib(); });
    const double own_s = seconds(own);  // last: its result stands
    ++own_calls_;
    AttnTiming tm;
    std::copy(k.begin(), k.end(), tm.key);
    tm.own_s = own_s;
    tm.lib_s = ran ? lib_s : std::numeric_limits<double>::infinity();
    pending_.push_back(tm);
    return;
  }
  run_own();
}

std::vector<AttnTiming> AttentionSelect::take_timings() { return std::exchange(pending_, {}); }

void AttentionSelect::agree(const std::vector<AttnTiming>& everyone) {
  struct Sum {
    double own = 0, lib = 0;
    int ranks = 0;
  };
  std::map<Key, Sum> sums;
  for (const AttnTiming& t : everyone) {
    Key k;
    std::copy(t.key, t.key + AttnTiming::kKey, k.begin());
    Sum& s = sums[k];
    s.own += t.own_s, s.lib += t.lib_s, ++s.ranks;
  }
  for (const auto& [k, s] : sums) {
    if (agreed_.count(k)) continue;
    const bool lib = s.lib < s.own;
    agreed_[k] = lib;
    timed_.erase(k);
    sdpa::ShapeClass c{sdpa::Pass(k[0]), cudnnDataType_t(k[1]), int(k[2]), int(k[3]), int(k[4]),
                       k[5] != 0, k[6], k[7], k[8]};
    spdlog::info("attention {}: own {:.3f} ms, cuDNN {} (first call, summed over {} rank(s)): {}", c.name(),
                 1e3 * s.own, std::isfinite(s.lib) ? fmt::format("{:.3f} ms", 1e3 * s.lib) : "no engine",
                 s.ranks, lib ? "cuDNN" : "own");
  }
}

}  // namespace dhp::cuda
