#include "parallel/device_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "kernels/attention_runs.h"

namespace dhp {
namespace {

// The median wall time of `repeats` runs of f after one warm-up, the device drained around
// each run (a device queues work; the host clock alone would time the queueing).
double median_seconds(Backend& backend, int repeats, const std::function<void()>& f) {
  f();
  backend.synchronize();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    backend.synchronize();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

DeviceProbe::Line fit_line(const std::vector<ProbePoint>& pts) {
  DeviceProbe::Line l;
  if (pts.empty()) return l;
  double sw = 0, st = 0, sww = 0, swt = 0;
  for (const auto& p : pts) sw += p.work, st += p.seconds, sww += p.work * p.work, swt += p.work * p.seconds;
  const double n = double(pts.size()), den = n * sww - sw * sw;
  if (pts.size() >= 2 && den > 0) {
    l.per_unit = (n * swt - sw * st) / den;
    l.fixed = (st - l.per_unit * sw) / n;
  }
  // A line through the origin where the intercept would be negative or the slope is not a rate.
  if (l.per_unit <= 0 || l.fixed < 0) {
    l.per_unit = sww > 0 ? swt / sww : 0;
    l.fixed = 0;
  }
  return l;
}

}  // namespace

std::vector<int64_t> chunk_ladder(int64_t lo, int64_t hi) {
  std::vector<int64_t> out;
  for (int64_t c = std::max<int64_t>(1, lo); c <= hi; c *= 2) out.push_back(c);
  return out;
}

DeviceProbe::Line DeviceProbe::attention_line() const { return fit_line(attention); }
DeviceProbe::Line DeviceProbe::transfer_line() const { return fit_line(transfer); }

CostCoeffs DeviceProbe::coeffs(CostCoeffs prior) const {
  if (gemm_seconds > 0 && gemm_flops > 0) prior.sec_per_flop = gemm_seconds / gemm_flops;
  // The slope of the line through every chunk size: a fixed cost per call is the
  // intercept's, not the rate's.
  if (const Line a = attention_line(); a.per_unit > 0) prior.sec_per_att_flop = a.per_unit;
  if (const Line x = transfer_line(); x.per_unit > 0) {
    prior.sec_per_byte_intra = x.per_unit;
    if (x.fixed > 0) prior.sec_per_step = x.fixed;
  }
  return prior;
}

std::string DeviceProbe::table(const CostCoeffs& builtin, const ModelConfig& m) const {
  std::string t = fmt::format("Linear products of a decoder layer ({} tokens), forward and backward: {:.3f} ms, "
                              "{:.2f} TFLOP/s\n",
                              gemm_tokens, 1e3 * gemm_seconds, gemm_flops / gemm_seconds / 1e12);
  t += fmt::format("\nattention over one causal document ({} heads, {} kv heads, head dim {}), forward and "
                   "backward:\n{:>8}  {:>10}  {:>9}  {:>11}\n",
                   m.heads, m.kv_heads, m.hd(), "tokens", "ms", "TFLOP/s", "built-in ms");
  for (const ProbePoint& a : attention)
    t += fmt::format("{:>8}  {:>10.3f}  {:>9.2f}  {:>11.3f}\n", a.size, 1e3 * a.seconds, a.work / a.seconds / 1e12,
                     1e3 * a.work * builtin.sec_per_att_flop);
  if (transfer.empty()) {
    t += "\nring transfer: one rank, not measured (run under mpirun -n 2 to measure it)\n";
  } else {
    t += fmt::format("\nring transfer between ranks 0 and 1, both ways at once:\n{:>12}  {:>10}  {:>8}\n", "bytes",
                     "ms", "GB/s");
    for (const ProbePoint& x : transfer)
      t += fmt::format("{:>12}  {:>10.3f}  {:>8.2f}\n", x.size, 1e3 * x.seconds, x.work / x.seconds / 1e9);
  }
  return t;
}

nlohmann::json DeviceProbe::to_json() const {
  nlohmann::json att = nlohmann::json::array(), xfer = nlohmann::json::array();
  for (const ProbePoint& a : attention) att.push_back({{"tokens", a.size}, {"seconds", a.seconds}, {"flops", a.work}});
  for (const ProbePoint& x : transfer) xfer.push_back({{"bytes", x.size}, {"seconds", x.seconds}});
  return {{"gemm_tokens", gemm_tokens}, {"gemm_seconds", gemm_seconds}, {"gemm_flops", gemm_flops},
          {"attention", att},           {"transfer", xfer}};
}

DeviceProbe probe_device(Backend& backend, const ModelConfig& cfg, const ProbeOptions& opt,
                         Communicator* comm) {
  DHP_CHECK(opt.repeats >= 1, "probe: repeats must be at least 1");
  const Ops& ops = backend.ops();
  const DType dt = ops.dtype();
  const int Hq = cfg.heads, Hkv = cfg.kv_heads, hd = cfg.hd();
  const int64_t d = cfg.dim, qd = cfg.q_dim(), kvd = cfg.kv_dim(), ffn = cfg.ffn;
  DeviceProbe out;
  auto act = [&](const DeviceBuffer& b) { return Act(b.data(), dt); };

  // The decoder layer's Linear products, forward and backward (dX and dW): three passes.
  {
    const int64_t T = opt.gemm_tokens, widest = std::max({qd + 2 * kvd, ffn, d});
    DeviceBuffer x(backend, dtype_size(dt) * size_t(T * widest)), y(backend, dtype_size(dt) * size_t(T * widest)),
        W(backend, dtype_size(dt) * size_t(widest * widest)), dW(backend, sizeof(float) * size_t(widest * widest)),
        dx(backend, dtype_size(dt) * size_t(T * widest));
    ops.fill(act(x), 0.01f, T * widest);
    ops.fill(act(W), 0.01f, widest * widest);
    const std::pair<int64_t, int64_t> shapes[] = {{d, qd + 2 * kvd}, {qd, d}, {d, ffn}, {d, ffn}, {ffn, d}};
    out.gemm_seconds = median_seconds(backend, opt.repeats, [&] {
      for (const auto& [in, o] : shapes) {
        ops.linear_forward(act(y), act(x), act(W), nullptr, T, in, o);
        ops.linear_backward(act(dx), dW.as<float>(), nullptr, act(y), act(x), act(W), T, in, o, false);
      }
    });
    for (const auto& [in, o] : shapes) out.gemm_flops += 3 * 2.0 * double(T) * double(in) * double(o);
    out.gemm_tokens = T;
  }

  // Attention over one causal document per chunk size, forward and backward.
  const std::vector<int64_t> chunks = opt.chunks.empty() ? chunk_ladder(64, 65536) : opt.chunks;
  const int64_t maxT = chunks.empty() ? 0 : *std::max_element(chunks.begin(), chunks.end());
  if (maxT > 0) {
    const size_t e = dtype_size(dt);
    DeviceBuffer q(backend, e * size_t(maxT * qd)), k(backend, e * size_t(maxT * kvd)),
        v(backend, e * size_t(maxT * kvd)), o(backend, e * size_t(maxT * qd)),
        dq(backend, e * size_t(maxT * qd)), dk(backend, e * size_t(maxT * kvd)),
        dv(backend, e * size_t(maxT * kvd)), lse(backend, sizeof(float) * size_t(maxT * Hq)),
        doc(backend, sizeof(int32_t) * size_t(maxT)), idx(backend, sizeof(int32_t) * size_t(maxT)),
        blk(backend, sizeof(int32_t) * size_t(maxT));
    ops.fill(act(q), 0.02f, maxT * qd);
    ops.fill(act(k), 0.03f, maxT * kvd);
    ops.fill(act(v), 0.5f, maxT * kvd);
    std::vector<int32_t> h0(static_cast<size_t>(maxT), 0), hidx(static_cast<size_t>(maxT)),
        hblk(static_cast<size_t>(maxT), -1);
    for (int64_t t = 0; t < maxT; ++t) hidx[size_t(t)] = int32_t(t);
    backend.upload(doc.data(), h0.data(), sizeof(int32_t) * h0.size());
    backend.upload(idx.data(), hidx.data(), sizeof(int32_t) * hidx.size());
    backend.upload(blk.data(), hblk.data(), sizeof(int32_t) * hblk.size());
    for (const int64_t T : chunks) {
      const std::vector<AttnRun> runs{AttnRun{0, T, 0, -1, 0, int32_t(T - 1), true}};
      const AttnMeta m{doc.as<int32_t>(), idx.as<int32_t>(), blk.as<int32_t>(),
                       AttnRuns{runs.data(), int64_t(runs.size())}};
      const AttnShape s{T, T, Hq, Hkv, hd, float(1.0 / std::sqrt(double(hd)))};
      const double sec = median_seconds(backend, opt.repeats, [&] {
        ops.attention_forward(act(o), lse.as<float>(), act(q), act(k), act(v), m, m, s);
        ops.attention_backward(act(dq), act(dk), act(dv), act(o), act(o), lse.as<float>(), act(q), act(k),
                               act(v), m, m, s);
      });
      // The cost model's count: 7 products of 2·Hq·hd FLOPs per kept (query, key) pair.
      out.attention.push_back({T, sec, 7.0 * 2.0 * double(qd) * double(T) * double(T + 1) / 2});
    }
  }

  // Ring transfer between ranks 0 and 1: both send and receive at once, as a ring step does.
  if (comm && comm->size() >= 2) {
    const std::vector<int64_t> sizes =
        opt.transfer_bytes.empty() ? chunk_ladder(int64_t(64) << 10, int64_t(64) << 20) : opt.transfer_bytes;
    const int64_t most = *std::max_element(sizes.begin(), sizes.end());
    const int me = comm->rank();
    DeviceBuffer send(backend, size_t(most)), recv(backend, size_t(most));
    backend.zero(send.data(), size_t(most));
    for (const int64_t bytes : sizes) {
      double sec = 0;
      if (me <= 1) {
        const int peer = 1 - me;
        const int64_t n = bytes / 4;
        sec = median_seconds(backend, opt.repeats, [&] {
          comm->exchange({Transfer::send(peer, send.as<float>(), n), Transfer::recv(peer, recv.as<float>(), n)})
              ->wait();
        });
      }
      comm->barrier();
      out.transfer.push_back({bytes, sec, double(bytes)});
    }
    // Rank 0's figures, everywhere.
    std::vector<double> secs;
    for (const auto& p : out.transfer) secs.push_back(p.seconds);
    comm->broadcast(secs.data(), int64_t(secs.size()), DataType::F64, 0);
    for (size_t i = 0; i < secs.size(); ++i) out.transfer[i].seconds = secs[i];
  }
  return out;
}

}  // namespace dhp
