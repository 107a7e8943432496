#!/usr/bin/env bash
# Regenerates the measured part of docs/planner.md: builds bench_planner, runs every section
# on one core, and replaces what lies between the "bench:begin" and "bench:end" markers.
#   scripts/planner_tables.sh [build-dir]     (default: build; configured by scripts/setup.sh)
# DHP_BENCH_CORE picks the core (default 0). The strategy tables take seconds; the whole run
# about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/CMakeCache.txt" ] || scripts/setup.sh "$build"
cmake --build "$build" --target bench_planner
out=$(mktemp)
trap 'rm -f "$out"' EXIT
OPENBLAS_NUM_THREADS=1 taskset -c "${DHP_BENCH_CORE:-0}" "$build/bench/bench_planner" > "$out"
python3 - "$out" docs/planner.md <<'PY'
import sys
bench, doc = sys.argv[1], sys.argv[2]
begin, end = "<!-- bench:begin (scripts/planner_tables.sh writes this part) -->", "<!-- bench:end -->"
text = open(doc).read()
i, j = text.index(begin), text.index(end)
body = open(bench).read().strip() + "\n"
open(doc, "w").write(text[:i + len(begin)] + "\n\n" + body + "\n" + text[j:])
print(f"{doc}: tables replaced ({len(body.splitlines())} lines)")
PY
