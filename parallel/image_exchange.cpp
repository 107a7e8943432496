#include "parallel/image_exchange.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace dhp {
namespace {

// Above the ring's tags (parallel/ring_attention.cpp) and within MPI's guaranteed 32767.
constexpr int kForwardTag = 31000;
constexpr int kBackwardTag = 31001;

}  // namespace

std::vector<int> assign_images(const std::vector<int64_t>& patches, int d) {
  DHP_ASSERT(d >= 1);
  std::vector<size_t> order(patches.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return patches[a] > patches[b]; });
  std::vector<int64_t> load(size_t(d), 0);
  std::vector<int> out(patches.size(), 0);
  for (size_t i : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    out[i] = r;
    load[size_t(r)] += patches[i];
  }
  return out;
}

ImageExchange::ImageExchange(Communicator& comm, Backend& backend)
    : comm_(comm), backend_(backend), ops_(backend.ops()), arena_(backend) {}

void ImageExchange::prepare(const std::vector<int>& ring,
                            const std::vector<std::vector<int32_t>>& send,
                            const std::vector<int64_t>& recv, int64_t N, int64_t C) {
  const size_t d = ring.size();
  DHP_ASSERT(send.size() == d && recv.size() == d && C > 0);
  const auto at = std::find(ring.begin(), ring.end(), comm_.rank());
  DHP_ASSERT(at != ring.end());
  ring_ = ring;
  me_ = int(at - ring.begin());
  N_ = N;
  C_ = C;
  send_off_.assign(d, 0), send_n_.assign(d, 0), recv_off_.assign(d, 0), recv_n_.assign(d, 0);
  idx_host_.clear();
  S_ = R_ = 0;
  for (size_t i = 0; i < d; ++i) {
    send_off_[i] = S_;
    send_n_[i] = int64_t(send[i].size());
    S_ += send_n_[i];
    for (int32_t r : send[i]) DHP_ASSERT(r >= -1 && r < N);
    idx_host_.insert(idx_host_.end(), send[i].begin(), send[i].end());
    recv_off_[i] = R_;
    recv_n_[i] = recv[i];
    R_ += recv[i];
  }
  DHP_ASSERT(send_n_[size_t(me_)] == recv_n_[size_t(me_)]);
  arena_.carve([&](Carver& c) {
    idx_ = c.take<int32_t>(S_);
    send_ = c.take(S_ * C, ops_.dtype());
    recv_ = c.take(R_ * C, ops_.dtype());
  });
  if (S_ > 0) backend_.upload(idx_, idx_host_.data(), sizeof(int32_t) * size_t(S_));
  waited_ = {};
}

void ImageExchange::move(CAct from, const std::vector<int64_t>& from_off,
                         const std::vector<int64_t>& from_n, Act into,
                         const std::vector<int64_t>& into_off, const std::vector<int64_t>& into_n,
                         int tag) {
  std::vector<Transfer> t;
  for (size_t i = 0; i < ring_.size(); ++i) {
    if (int(i) == me_) continue;
    if (from_n[i] > 0) t.push_back(Transfer::send(ring_[i], from + from_off[i] * C_, from_n[i] * C_, tag));
    if (into_n[i] > 0) t.push_back(Transfer::recv(ring_[i], into + into_off[i] * C_, into_n[i] * C_, tag));
  }
  const size_t m = size_t(me_);
  if (from_n[m] > 0)
    backend_.copy((into + into_off[m] * C_).p, (from + from_off[m] * C_).p,
                  dtype_size(from.t) * size_t(from_n[m] * C_));
  if (!t.empty()) waited_.wait(*comm_.exchange(t));
}

CAct ImageExchange::forward(CAct tokens, int64_t C) {
  DHP_ASSERT(C == C_);
  if (S_ > 0) {
    // Rows of an image that failed to load stay zero.
    ops_.fill(send_, 0.0f, S_ * C);
    ops_.scatter_rows(send_, tokens, idx_, S_, C);
  }
  move(send_, send_off_, send_n_, recv_, recv_off_, recv_n_, kForwardTag);
  return recv_;
}

void ImageExchange::backward(Act dtokens, CAct drows, int64_t C) {
  DHP_ASSERT(C == C_);
  move(drows, recv_off_, recv_n_, send_, send_off_, send_n_, kBackwardTag);
  if (N_ == 0) return;
  ops_.fill(dtokens, 0.0f, N_ * C);
  if (S_ > 0) ops_.gather_rows(dtokens, send_, idx_, S_, C);
}

}  // namespace dhp
