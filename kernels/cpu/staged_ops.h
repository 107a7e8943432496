// bf16 storage on the CPU: every op converts its bf16 arguments to fp32, runs the fp32
// reference kernel, and rounds what it writes back to bf16. The arithmetic is the reference's;
// what changes is where values are rounded, which is exactly what a bf16 device rounds too
// (activations and the working weights), so a CPU run shows what bf16 storage does to training
// and lets the model's bf16 paths (casts, staging, exchanges of bf16 rows) run in tests.
// Conversions cost time: this is for correctness and memory, not speed.
#pragma once

#include <memory>

#include "kernels/ops.h"

namespace dhp {

// Wraps fp32 reference ops (which must outlive the result).
std::unique_ptr<Ops> make_bf16_staged_ops(const Ops& fp32);

}  // namespace dhp
