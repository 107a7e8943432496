#!/usr/bin/env bash
# Set-up plus the whole test suite (ctest). Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
