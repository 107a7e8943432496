#!/usr/bin/env bash
# Set-up plus the whole test suite (ctest). Extra arguments go to ctest.
#   scripts/test.sh            everything (what CI runs)
#   scripts/test.sh --quick    a developer's inner loop: leaves out the tests labelled `slow`
#                              (the multi-process scripts, each 20 s or more)
# docs/testing.md has the suite's figures and how they were measured.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest_args=()
for a in "$@"; do
  if [ "$a" = "--quick" ]; then ctest_args+=(-LE slow); else ctest_args+=("$a"); fi
done
scripts/setup.sh build
cd build
ctest --output-on-failure -j"$(nproc)" "${ctest_args[@]}"
