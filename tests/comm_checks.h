// Checks of a Communicator against a plain serial computation, shared by the threaded tests
// (any N in one process) and the mpirun test. Each throws dhp::Error describing the first
// mismatch, so a failure on any rank surfaces wherever the ranks are joined.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "core/check.h"
#include "parallel/communicator.h"

namespace dhp::testing {

// A value that differs per rank and element and is exact in float.
inline float value_of(int rank, int64_t i) { return float((rank + 1) * 1000 + (i % 997)) * 0.25f; }

template <class T>
void expect_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what,
                  int rank) {
  DHP_CHECK(got.size() == want.size(), "rank {}: {}: {} values, expected {}", rank, what,
            got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    DHP_CHECK(got[i] == want[i], "rank {}: {}: element {} is {}, expected {}", rank, what, i,
              double(got[i]), double(want[i]));
}

inline void check_collectives(Communicator& c, int64_t count) {
  const int N = c.size(), r = c.rank();
  // all_reduce sum and max, float, double and integers, against the rank-order serial result.
  std::vector<float> f(count), fsum(count), fmax(count);
  std::vector<double> d(count), dsum(count);
  std::vector<int64_t> k(count), ksum(count);
  for (int64_t i = 0; i < count; ++i) {
    f[i] = value_of(r, i);
    d[i] = double(value_of(r, i)) / 3.0;
    k[i] = int64_t(r) * 1000003 + i;
    for (int q = 0; q < N; ++q) {
      fsum[i] = q == 0 ? value_of(q, i) : fsum[i] + value_of(q, i);
      fmax[i] = q == 0 ? value_of(q, i) : std::max(fmax[i], value_of(q, i));
      dsum[i] = q == 0 ? double(value_of(q, i)) / 3.0 : dsum[i] + double(value_of(q, i)) / 3.0;
      ksum[i] += int64_t(q) * 1000003 + i;
    }
  }
  std::vector<float> fm = f;
  c.all_reduce_sum(f.data(), count);
  expect_equal(f, fsum, "all_reduce sum (f32)", r);
  c.all_reduce_max(fm.data(), count);
  expect_equal(fm, fmax, "all_reduce max (f32)", r);
  c.all_reduce_sum(d.data(), count);
  for (int64_t i = 0; i < count; ++i)
    DHP_CHECK(std::abs(d[i] - dsum[i]) <= 1e-12 * std::abs(dsum[i]),
              "rank {}: all_reduce sum (f64): element {} is {}, expected {}", r, i, d[i], dsum[i]);
  c.all_reduce_sum(k.data(), count);
  expect_equal(k, ksum, "all_reduce sum (i64)", r);

  // reduce_scatter: block r of the sum of every rank's (N * count) buffer.
  std::vector<float> send(size_t(N) * count), recv(count), want(count);
  for (int64_t i = 0; i < N * count; ++i) send[i] = value_of(r, i);
  for (int64_t i = 0; i < count; ++i)
    for (int q = 0; q < N; ++q) want[i] = q == 0 ? value_of(q, r * count + i) : want[i] + value_of(q, r * count + i);
  c.reduce_scatter(send.data(), recv.data(), count, DataType::F32);
  expect_equal(recv, want, "reduce_scatter", r);
  // In place: the sum replaces this rank's own block of the send buffer (ZeRO-1's gradients).
  c.reduce_scatter(send.data(), send.data() + r * count, count, DataType::F32);
  expect_equal(std::vector<float>(send.begin() + r * count, send.begin() + (r + 1) * count), want,
               "reduce_scatter in place", r);

  // all_gather: block q is rank q's buffer.
  std::vector<int32_t> mine(count), all(size_t(N) * count), all_want(size_t(N) * count);
  for (int64_t i = 0; i < count; ++i) mine[i] = int32_t(r * 7919 + i);
  for (int q = 0; q < N; ++q)
    for (int64_t i = 0; i < count; ++i) all_want[size_t(q) * count + i] = int32_t(q * 7919 + i);
  c.all_gather(mine.data(), all.data(), count, DataType::I32);
  expect_equal(all, all_want, "all_gather", r);

  // broadcast from every root in turn.
  for (int root = 0; root < N; ++root) {
    std::vector<double> b(count, -1.0), b_want(count);
    for (int64_t i = 0; i < count; ++i) b_want[i] = root * 0.5 + double(i);
    if (r == root) b = b_want;
    c.broadcast(b.data(), count, DataType::F64, root);
    expect_equal(b, b_want, fmt::format("broadcast from rank {}", root), r);
  }
  c.barrier();
}

// Grouped, non-blocking sends and receives: a ring both ways, an all-to-all with a different
// size per pair (including messages to itself), and ordered messages under one tag.
inline void check_exchanges(Communicator& c) {
  const int N = c.size(), r = c.rank();
  const int next = (r + 1) % N, prev = (r + N - 1) % N;
  auto payload = [](int src, int dst, int64_t n) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = float(src * 100 + dst) + float(i) * 0.5f;
    return v;
  };
  {
    std::vector<float> to_next = payload(r, next, 33), to_prev = payload(r, prev, 17);
    std::vector<float> from_prev(33), from_next(17);
    auto ex = c.exchange({Transfer::send(next, to_next.data(), 33, 1),
                          Transfer::send(prev, to_prev.data(), 17, 2),
                          Transfer::recv(prev, from_prev.data(), 33, 1),
                          Transfer::recv(next, from_next.data(), 17, 2)});
    ex->wait();
    expect_equal(from_prev, payload(prev, r, 33), "ring receive from the previous rank", r);
    expect_equal(from_next, payload(next, r, 17), "ring receive from the next rank", r);
  }
  {
    std::vector<std::vector<float>> out(N), in(N);
    std::vector<Transfer> t;
    for (int q = 0; q < N; ++q) {
      out[q] = payload(r, q, 5 + r * 3 + q);
      in[q].resize(size_t(5 + q * 3 + r));
      t.push_back(Transfer::recv(q, in[q].data(), int64_t(in[q].size()), 7));
      t.push_back(Transfer::send(q, out[q].data(), int64_t(out[q].size()), 7));
    }
    c.exchange(t)->wait();
    for (int q = 0; q < N; ++q)
      expect_equal(in[q], payload(q, r, 5 + q * 3 + r), fmt::format("all-to-all from rank {}", q), r);
  }
  {
    // Three messages to the next rank under one tag arrive in the order they were sent.
    std::vector<int64_t> a{1, 2}, b{3, 4, 5}, cc{6};
    std::vector<int64_t> ra(2), rb(3), rc(1);
    auto ex = c.exchange({Transfer::send(next, a.data(), 2, 3), Transfer::send(next, b.data(), 3, 3),
                          Transfer::send(next, cc.data(), 1, 3), Transfer::recv(prev, ra.data(), 2, 3),
                          Transfer::recv(prev, rb.data(), 3, 3), Transfer::recv(prev, rc.data(), 1, 3)});
    ex->wait();
    expect_equal(ra, a, "first ordered message", r);
    expect_equal(rb, b, "second ordered message", r);
    expect_equal(rc, cc, "third ordered message", r);
  }
  c.barrier();
}

}  // namespace dhp::testing
