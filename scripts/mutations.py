#!/usr/bin/env python3
"""Checks that the tests still catch known faults: each mutation edits one source file, rebuilds
the test binary that must catch it, runs the named tests and expects them to FAIL; the file is
restored afterwards whatever happens. Run it after changing a test's shapes or cases, or the
emulator, to show the change kept the test's power.

    scripts/mutations.py [--build build] [--only NAME ...] [--list]

Exit status 0 when every mutation was caught; the table printed names each and the time its
tests took.
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name, file, the text to replace (must occur exactly once), its replacement, the test binary,
# the gtest filter of the tests that must fail.
MUTATIONS = [
    ("dkdv-prefetch-before-barrier",
     "kernels/cuda/attention_kernels.cuh",
     """      __syncthreads();
      // The staging buffer is read: the next visible pair flies in while this one computes.
      if constexpr (kStaged)
        if (next < n) stage_next(next);""",
     """      if constexpr (kStaged)
        if (next < n) stage_next(next);
      __syncthreads();""",
     "test_cuda_attention_emulated", "*Bf16StorageMatchesTheCpuReference/hd16"),
    ("dq-prefetch-before-barrier",
     "kernels/cuda/attention_kernels.cuh",
     """    __syncthreads();
    // The staging buffer is read: the next visible pair flies in while this one computes.
    if constexpr (kStaged)
      if (next < nkt) stage_next(next);""",
     """    if constexpr (kStaged)
      if (next < nkt) stage_next(next);
    __syncthreads();""",
     "test_cuda_attention_emulated", "*Bf16StorageMatchesTheCpuReference/hd64"),
    ("forward-missing-barrier",
     "kernels/cuda/attention_kernels.cuh",
     "    __syncthreads();  // the previous tile's reads of kv, ps and row_alpha are done\n",
     "",
     "test_cuda_attention_emulated", "*CudaAttentionEmulated.MatchesTheCpuReference/hd32"),
    ("merge-missing-syncwarp",
     "kernels/cuda/attention_merge.cuh",
     "  __syncwarp();\n  if (lb == -INFINITY) return;",
     "  if (lb == -INFINITY) return;",
     "test_cuda_attention_emulated", "CudaAttentionMergeEmulated.*"),
    ("tile-skip-future-key-off-by-one",
     "kernels/cuda/attention_tiles.cuh",
     "  if (k.idx_lo <= q.idx_hi) return true;",
     "  if (k.idx_lo < q.idx_hi) return true;",
     "test_cuda_attention_emulated", "*CudaAttentionEmulated.MatchesTheCpuReference/hd16"),
    ("tf32-fragment-row-swap",
     "tests/cuda_emulator.h",
     "const int row = g + 8 * (e / 2), col = 2 * t + e % 2;",
     "const int row = g + 8 * (e % 2), col = 2 * t + e / 2;",
     "test_cuda_attention_emulated", "*Tf32MatchesTheCpuReference/hd16"),
    # RMSNorm's dw over row slices (Qwen3's q/k norms): the final sum skips slice 0.
    ("rmsnorm-dw-drops-a-slice",
     "kernels/cuda/norm_kernels.cuh",
     "for (int s = 0; s < slices; ++s) total += partial",
     "for (int s = 1; s < slices; ++s) total += partial",
     "test_cuda_kernels_emulated", "*RmsNormDwWithinItsSummationBound*:*rmsnorm_1100x33_fp32*"),
    # A warp per narrow row: lanes stride by half a warp, so half of each row is read twice.
    ("rmsnorm-warp-row-half-stride",
     "kernels/cuda/norm_kernels.cuh",
     "            kWarp};",
     "            kWarp / 2};",
     "test_cuda_kernels_emulated", "*rmsnorm_37x300_fp32*"),
]


def run(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    build = os.path.join(ROOT, args.build)
    chosen = [m for m in MUTATIONS if not args.only or m[0] in args.only]
    if args.list:
        for m in chosen:
            print(f"{m[0]}: {m[1]} -> {m[4]} --gtest_filter={m[5]}")
        return 0
    missed = []
    print("| mutation | tests | caught | seconds |\n|---|---|---|---|")
    for name, path, old, new, binary, flt in chosen:
        full = os.path.join(ROOT, path)
        original = open(full).read()
        if original.count(old) != 1:
            print(f"| {name} | {flt} | the text to mutate occurs {original.count(old)} times in {path} | |")
            missed.append(name)
            continue
        try:
            with open(full, "w") as f:
                f.write(original.replace(old, new))
            b = run(["ninja", f"tests/{binary}"], build)
            if b.returncode != 0:
                print(f"| {name} | {flt} | does not compile (not a useful mutation) | |")
                missed.append(name)
                continue
            t0 = time.time()
            r = run([os.path.join(build, "tests", binary), f"--gtest_filter={flt}"], build)
            took = time.time() - t0
            caught = r.returncode != 0 and "FAILED" in r.stdout
            print(f"| {name} | {flt} | {'yes' if caught else 'NO'} | {took:.1f} |")
            if not caught:
                missed.append(name)
        finally:
            with open(full, "w") as f:
                f.write(original)
    # Leave the binaries built from the restored sources.
    for binary in sorted({m[4] for m in chosen}):
        run(["ninja", f"tests/{binary}"], build)
    if missed:
        print("not caught: " + ", ".join(missed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
