// Choices of the CPU attention kernel that tests and benchmarks may override (not
// thread-safe; set them before any call).
//
// Instruction set: the kernel is compiled for several (function-level targets; the build
// itself assumes plain x86-64) and picks the widest the machine supports. Tests force the
// narrower ones to check every variant on one machine.
//
// Kept dS: the backward pass keeps dS·scale of every visible tile pair and head of a batch of
// key tiles between its two passes, batching the key tiles so that this stays under a budget. Tests set a
// tiny budget to check that batching changes no bit.
#pragma once

#include <cstdint>

namespace dhp::cpu {

enum class AttnIsa { generic, avx2, avx512, best };

// The variant attention_forward / attention_backward use now: the machine's best, or the one
// set_attention_isa asked for when the machine supports it.
AttnIsa attention_isa();
// AttnIsa::best restores the default.
void set_attention_isa(AttnIsa isa);

// Floats of dS kept at once by attention_backward, over every head (default 128 Ki: 512 KiB,
// to stay in a core's L2 cache). At least one key tile is taken per batch whatever the budget.
int64_t attention_kept_ds_floats();
void set_attention_kept_ds_floats(int64_t n);

}  // namespace dhp::cpu
