// Which instruction set the CPU attention kernel runs with. The kernel is compiled for several
// (function-level targets; the build itself assumes plain x86-64) and picks the widest the
// machine supports. Tests force the narrower ones to check every variant on one machine.
#pragma once

namespace dhp::cpu {

enum class AttnIsa { generic, avx2, avx512, best };

// The variant attention_forward / attention_backward use now: the machine's best, or the one
// set_attention_isa asked for when the machine supports it.
AttnIsa attention_isa();
// For tests and benchmarks only (not thread-safe): AttnIsa::best restores the default.
void set_attention_isa(AttnIsa isa);

}  // namespace dhp::cpu
