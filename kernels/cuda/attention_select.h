// Which attention runs a call on the CUDA backend (train.attention): the own kernel, cuDNN's
// fused attention where it can take the call (cudnn_attention.h), or under "auto" whichever
// the ranks measured faster for the call's shape class. The first call of a class runs both
// (cuDNN first, then the own kernel, whose result stands) and compares their results: cuDNN is
// used for a class only where they agree. Under "auto" that call also keeps the two times;
// the trainer gathers every rank's times between steps (Backend::take_attention_timings,
// agree_attention) and every rank installs the same choice per class. Until then the class
// runs the own kernel, on every rank alike.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cudnn_attention.h"

namespace dhp::cuda {

class AttentionSelect {
 public:
  // `lib` may be null (cuDNN unusable here): every call runs the own kernel.
  AttentionSelect(AttentionImpl mode, std::unique_ptr<CudnnAttention> lib, cudaStream_t stream);
  ~AttentionSelect();

  // The first call of a class runs both kernels, the library's first: save() keeps the
  // library's outputs aside, distance() says how far the own kernel's outputs lie from them
  // (relative L2). A library result farther than kTolerance (or not finite) is never used.
  struct Verify {
    std::function<void()> save;
    std::function<double()> distance;
  };
  // bf16 outputs of two correct kernels differ by a few 1e-3 in relative L2; a wrong mask,
  // layout or offset by far more.
  static constexpr double kTolerance = 5e-2;

  // Runs one call: lib() (which returns false when it did not run) or own().
  void run(sdpa::Pass pass, DType t, const AttnMeta& qm, const AttnMeta& km, const AttnShape& s,
           const std::function<void()>& own, const std::function<bool()>& lib, const Verify& verify);

  std::vector<AttnTiming> take_timings();
  void agree(const std::vector<AttnTiming>& everyone);

  CudnnAttention* library() const { return lib_.get(); }
  // Calls that ran on the library and on the own kernel since construction.
  int64_t library_calls() const { return lib_calls_; }
  int64_t own_calls() const { return own_calls_; }

 private:
  using Key = std::array<int64_t, AttnTiming::kKey>;
  static Key key_of(const sdpa::ShapeClass& c);
  // Seconds of f on the stream: the best of three after a warm-up.
  double seconds(const std::function<void()>& f);
  // Runs the library, then the own kernel (whose result stands), and compares them: whether
  // the library ran and matched. Times both when own_s and lib_s are given.
  bool both(const sdpa::ShapeClass& c, const std::function<void()>& own, const std::function<bool()>& lib,
            const Verify& verify, double* own_s, double* lib_s);

  AttentionImpl mode_;
  std::unique_ptr<CudnnAttention> lib_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::map<Key, bool> agreed_;    // class -> the library runs it (auto)
  std::map<Key, bool> verified_;  // class -> the library's result matched the own kernel's (cudnn)
  std::set<Key> timed_;           // timed here, not yet agreed
  std::vector<AttnTiming> pending_;
  std::set<std::string> told_;  // fallback reasons already logged
  int64_t lib_calls_ = 0, own_calls_ = 0;
};

}  // namespace dhp::cuda
