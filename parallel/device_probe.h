// The device's own rates, measured op by op on any backend, for the planner's cost model
// (design.md §2.1): the Linear products of the model's decoder layer (sec_per_flop), attention
// forward and backward over one causal document per chunk size (sec_per_att_flop, and the
// table of rates against chunk size), and, where there are two ranks, the ring transfer per
// byte and per step between them (sec_per_byte_intra, sec_per_step). `dhp profile` starts its
// fit of whole steps from these instead of a datasheet profile.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "parallel/communicator.h"
#include "parallel/cost_model.h"
#include "types/model_config.h"

namespace dhp {

struct ProbeOptions {
  std::vector<int64_t> chunks;   // attention chunk sizes (tokens); empty: 64 .. 64k, doubling
  int64_t gemm_tokens = 4096;    // rows of the timed Linear products
  std::vector<int64_t> transfer_bytes;  // ring transfer sizes; empty: 64 KiB .. 64 MiB
  int repeats = 3;               // timed runs per point (the median counts), after one warm-up
};

// Chunk sizes from `lo` to `hi` tokens, each 2x the last.
std::vector<int64_t> chunk_ladder(int64_t lo, int64_t hi);

struct ProbePoint {
  int64_t size = 0;     // tokens (attention) or bytes (transfer)
  double seconds = 0;   // median
  double work = 0;      // FLOPs (attention: the cost model's count of kept pairs) or bytes
};

struct DeviceProbe {
  int64_t gemm_tokens = 0;
  double gemm_seconds = 0, gemm_flops = 0;
  std::vector<ProbePoint> attention;  // per chunk size
  std::vector<ProbePoint> transfer;   // per size; empty with one rank
  // A least-squares line t = a·work + b through the points (a and b clamped positive).
  struct Line {
    double per_unit = 0, fixed = 0;
  };
  Line attention_line() const;
  Line transfer_line() const;
  // `prior` with the terms this probe measured replaced.
  CostCoeffs coeffs(CostCoeffs prior) const;
  // The measurements as tables (the Linear products, attention per chunk size against what
  // `builtin` predicts, ring transfer), and as JSON.
  std::string table(const CostCoeffs& builtin, const ModelConfig& m) const;
  nlohmann::json to_json() const;
};

// Measures `backend` on the decoder shape of `cfg` (its heads, kv heads, head dimension and
// widths). With `comm` of two ranks or more, ranks 0 and 1 time transfers between them (every
// rank must call); otherwise no transfer is measured.
DeviceProbe probe_device(Backend& backend, const ModelConfig& cfg, const ProbeOptions& opt,
                         Communicator* comm);

}  // namespace dhp
