#include "kernels/cuda/attention_select.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

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

bool AttentionSelect::both(const sdpa::ShapeClass& c, const std::function<void()>& own,
                           const std::function<bool()>& lib, const Verify& verify, double* own_s,
                           double* lib_s) {
  bool ran = true;
  auto run_lib = [&] { ran = lib() && ran; };
  if (lib_s) {
    *lib_s = seconds(run_lib);
  } else {
    run_lib();
  }
  if (ran) verify.save();
  if (own_s) {
    *own_s = seconds(own);
  } else {
    own();
  }
  ++own_calls_;
  if (!ran) return false;
  const double d = verify.distance();
  if (d <= kTolerance) return true;  // NaN fails too
  spdlog::warn("attention {}: cuDNN's result lies {:.3g} (relative L2) from dhp's own kernel's, above {}: "
               "cuDNN is not used for it",
               c.name(), d, kTolerance);
  return false;
}

void AttentionSelect::run(sdpa::Pass pass, DType t, const AttnMeta& qm, const AttnMeta& km,
                          const AttnShape& s, const std::function<void()>& own,
                          const std::function<bool()>& lib, const Verify& verify) {
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
  const Key k = key_of(c);
  if (mode_ == AttentionImpl::cudnn) {
    auto it = verified_.find(k);
    if (it == verified_.end()) {
      verified_[k] = both(c, own, lib, verify, nullptr, nullptr);
      return;
    }
    if (it->second && lib()) {
      ++lib_calls_;
      return;
    }
    return run_own();
  }
  if (auto it = agreed_.find(k); it != agreed_.end()) {
    if (it->second && lib()) {
      ++lib_calls_;
      return;
    }
    return run_own();
  }
  if (timed_.insert(k).second) {
    AttnTiming tm;
    std::copy(k.begin(), k.end(), tm.key);
    if (!both(c, own, lib, verify, &tm.own_s, &tm.lib_s)) tm.lib_s = std::numeric_limits<double>::infinity();
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
