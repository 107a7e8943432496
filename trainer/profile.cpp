#include "trainer/profile.h"

#include <algorithm>
#include <chrono>

#include "core/clock.h"

namespace dhp {

Batch profile_batch(const ModelConfig& cfg, const ProfileShape& sh, uint64_t seed) {
  Batch b;
  const int m = cfg.vision.merge;
  const int64_t pn = cfg.vision.patch_numel();
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 7;
  auto next = [&] { return x ^= x << 13, x ^= x >> 7, x ^= x << 17, x; };
  int32_t slot = 0;
  for (int di = 0; di < sh.docs; ++di) {
    int32_t pos = 0;
    for (int i = 0; i < sh.images; ++i) {
      PackedImage im{b.n_patches(), sh.grid, sh.grid};
      for (int64_t k = 0; k < int64_t(sh.grid) * sh.grid * pn; ++k)
        b.pixels.push_back(uint8_t(next() % 256));
      b.images.push_back(im);
      for (int t = 0; t < sh.grid * sh.grid / (m * m); ++t) {
        b.tokens.push_back(0), b.image_slot.push_back(slot++), b.doc.push_back(di), b.pos.push_back(pos++);
        b.targets.push_back(-1);
      }
    }
    for (int64_t t = 0; t < sh.text; ++t) {
      b.tokens.push_back(int32_t(1 + next() % uint64_t(cfg.vocab_size - 1)));
      b.image_slot.push_back(-1), b.doc.push_back(di), b.pos.push_back(pos++);
      b.targets.push_back(t + 1 < sh.text ? int32_t(1 + next() % uint64_t(cfg.vocab_size - 1)) : -1);
    }
    b.sample_ids.push_back(di);
  }
  b.T = int64_t(b.tokens.size());
  return b;
}

std::vector<ProfileShape> profile_shapes(const ModelConfig& cfg, bool quick) {
  const int m = cfg.vision.merge;
  std::vector<ProfileShape> out;
  const std::vector<int64_t> lengths = quick ? std::vector<int64_t>{128, 1024} : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048, 4096};
  for (int64_t L : lengths) out.push_back({1, L, 0, 0});
  for (int docs : {4, 16})
    for (int64_t L : quick ? std::vector<int64_t>{64} : std::vector<int64_t>{32, 128, 256}) out.push_back({docs, L, 0, 0});
  const std::vector<int> grids = quick ? std::vector<int>{4 * m} : std::vector<int>{4 * m, 8 * m, 16 * m};
  for (int grid : grids)
    for (int images : quick ? std::vector<int>{1} : std::vector<int>{1, 2, 4, 8}) out.push_back({1, 48, images, grid});
  if (!quick) out.push_back({4, 64, 2, 8 * m}), out.push_back({2, 512, 1, 16 * m});
  return out;
}

namespace {

std::unique_ptr<Backend> cpu_backend(int threads) {
  BackendOptions bo;
  bo.threads = threads;
  return make_cpu_backend(bo);
}

}  // namespace

StepProfiler::StepProfiler(const ModelConfig& cfg, std::unique_ptr<Backend> backend, int threads)
    : cfg_(cfg), threads_(threads), backend_(std::move(backend)), model_(cfg, *backend_) {
  model_.initialise(1);
}

StepProfiler::StepProfiler(const ModelConfig& cfg, int threads)
    : StepProfiler(cfg, cpu_backend(threads), threads) {}

TimingObservation StepProfiler::measure(const ProfileShape& sh, int repeats, uint64_t seed) {
  const Batch b = profile_batch(cfg_, sh, seed);
  model_.zero_grads();
  model_.step(b, 1.0f / float(std::max<int64_t>(1, b.loss_tokens())), true);  // warm-up
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto w0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    model_.step(b, 1.0f / float(std::max<int64_t>(1, b.loss_tokens())), true);
    backend_->synchronize();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
    // One thread: the thread's own CPU time, immune to other processes on the machine.
    const bool cpu_thread = backend_->device() == Device::CPU && threads_ == 1;
    t.push_back(cpu_thread ? thread_cpu_seconds() - c0 : wall);
  }
  std::sort(t.begin(), t.end());
  TimingObservation ob;
  ob.degree = 1;
  ob.seconds = t[t.size() / 2];
  const int64_t vision_per_doc = int64_t(sh.images) * sh.grid * sh.grid / (cfg_.vision.merge * cfg_.vision.merge);
  for (int d = 0; d < sh.docs; ++d)
    ob.seqs.push_back({d, sh.text, vision_per_doc, int32_t(vision_per_doc > 0 ? sh.images : 0)});
  return ob;
}

}  // namespace dhp
