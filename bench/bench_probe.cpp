// The device's cost coefficients where the dhp executable is not built (the GPU check's reduced
// build): parallel/device_probe.h on the CUDA backend in bf16 for a model shape, printed next
// to a built-in cost profile, and written as a coefficients file that `dhp plan --coeffs`
// reads (the format of `dhp profile --probe-only`).
//
//   bench_probe [--model-profile 7b] [--prior h200] [--max-chunk 16384] [--repeats 2]
//               [--out coeffs.json]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#include "parallel/device_probe.h"

int main(int argc, char** argv) {
  CLI::App app{"The CUDA device's cost coefficients for the planner"};
  std::string model = "7b", prior = "h200", out = "coeffs.json";
  int64_t max_chunk = 16384;
  int repeats = 2;
  app.add_option("--model-profile", model, "Model shape: tiny, 7b")->capture_default_str();
  app.add_option("--prior", prior, "Built-in cost profile shown beside: a100, h100, h200")->capture_default_str();
  app.add_option("--max-chunk", max_chunk, "Longest attention chunk, tokens")->capture_default_str();
  app.add_option("--repeats", repeats, "Timed runs per point (the median counts)")->capture_default_str();
  app.add_option("--out", out, "Coefficients file")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const dhp::CudaStatus st = dhp::cuda_status();
  if (st.devices == 0) {
    fmt::print(stderr, "bench_probe: no CUDA device ({})\n", st.reason);
    return 1;
  }
  try {
    dhp::BackendOptions o;
    o.precision = dhp::Precision::bf16;
    const auto backend = dhp::make_cuda_backend(o);
    const dhp::ModelConfig m = dhp::model_profile(model);
    const dhp::CostCoeffs builtin = dhp::device_profile(prior).coeffs;
    dhp::ProbeOptions po;
    po.repeats = repeats;
    po.chunks = dhp::chunk_ladder(64, max_chunk);
    po.gemm_tokens = 8192;
    fmt::print("device: {}; model {} (dim {}, {} heads, {} kv heads, head dim {}), bf16\n\n", st.name, model, m.dim,
               m.heads, m.kv_heads, m.hd());
    const dhp::DeviceProbe p = dhp::probe_device(*backend, m, po, nullptr);
    fmt::print("{}", p.table(builtin, m));
    const dhp::CostCoeffs fit = p.coeffs(builtin);
    fmt::print("\ncoefficients, as rates (per second):\n  {:<20} {:>14} {:>12}\n", "", prior + " (built-in)", "probed");
    for (int i = 0; i < dhp::CostCoeffs::kCount; ++i)
      fmt::print("  {:<20} {:>14.4g} {:>12.4g}\n", dhp::CostCoeffs::name(i), 1 / builtin[i], 1 / fit[i]);
    const nlohmann::json j = {{"coeffs", fit.to_json()},        {"observations", nlohmann::json::array()},
                              {"device", "cuda"},                {"device_name", st.name},
                              {"builtin_profile", prior},        {"builtin_coeffs", builtin.to_json()},
                              {"probe", p.to_json()},            {"model_profile", model}};
    std::ofstream(out) << j.dump(2) << "\n";
    fmt::print("wrote {}\n", out);
  } catch (const dhp::Error& e) {
    fmt::print(stderr, "bench_probe: {}\n", e.what());
    return 1;
  }
  return 0;
}
