#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer, in its own build
# folder (CI keeps the normal build; this is the slower, stricter pass).
#   scripts/sanitize.sh [ctest arguments...]      e.g. scripts/sanitize.sh -R 'Faults|Fuzz'
# Environment: DHP_SANITIZE (default address,undefined), BUILD_DIR (default build-sanitize),
# JOBS (default: all cores), DHP_CMAKE_ARGS (more CMake arguments).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build-sanitize}
jobs=${JOBS:-$(nproc)}

# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDHP_CUDA=OFF \
  -DDHP_BENCH=OFF "-DDHP_SANITIZE=${DHP_SANITIZE:-address,undefined}" ${DHP_CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$jobs"

# Leak checking stays off: MPI, OpenMP and SentencePiece keep process-lifetime allocations
# that would drown real reports. Memory errors and undefined behaviour stop the test.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd "$build_dir"
ctest --output-on-failure -j"$jobs" "$@"
