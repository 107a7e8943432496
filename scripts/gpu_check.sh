#!/usr/bin/env bash
# The GPU check, unattended, on a machine with an NVIDIA GPU, CUDA, CMake and a python3 with
# PyTorch (the lent H200: docs/kernels.md, "GPU check"). Builds only the CUDA tests and
# benches, runs the tests (the cuDNN attention path against the CPU reference among them) with
# a passed/failed/skipped summary, runs the benches (attention: our kernel, cuDNN's and, in the
# table, PyTorch's on the same shapes), fits the planner's cost coefficients to the device and
# plans the headline workload with them, and prints one table of ours against PyTorch with the
# training step's tokens/s and MFU. Meant to finish well inside 8 minutes on 16 cores.
#
#   scripts/gpu_check.sh                   everything
#   scripts/gpu_check.sh --build-only      configure and build, run nothing
#   scripts/gpu_check.sh --configure-only  configure only
#   scripts/gpu_check.sh --unpack-only DEBS PREFIX   (used by scripts/gpu_deps.sh)
#
# Libraries: the full project's dependencies are used where the machine has them; otherwise
# the build is the reduced one (DHP_GPU_CHECK_ONLY) against the Debian packages that
# scripts/gpu_deps.sh fetched into .gpu-deps/debs, unpacked into a prefix in the build folder.
# NCCL and cuDNN come from the CUDA toolkit or else from PyTorch's pip packages (nvidia.nccl,
# nvidia.cudnn).
#
# Environment: GPU_CHECK_BUILD (build folder, default build-gpu), GPU_CHECK_MODE (auto, full or
# reduced), GPU_CHECK_ARCH (CUDA architectures, default 90), GPU_CHECK_JOBS, GPU_CHECK_CMAKE_ARGS
# (more configure arguments), GPU_CHECK_TEST_TIMEOUT, GPU_CHECK_BENCH_TIMEOUT and
# GPU_CHECK_TORCH_TIMEOUT (seconds per binary, cut to keep the whole run inside
# GPU_CHECK_DEADLINE, 450 s), GPU_DEPS_DEBS, GPU_DEPS_PREFIX. Results go to $OUT when it is set (the device
# tool's folder; at most 8 files: gpu_check.log, tests_summary.txt, bench.jsonl, coeffs.json,
# table.txt), else to <build>/out.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
arch_dir=x86_64-linux-gnu

unpack() {  # unpack DEBS_FOLDER PREFIX: every .deb, into PREFIX only
  local debs=$1 prefix=$2 f
  mkdir -p "$prefix"
  for f in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix" || return 1
    else
      # No dpkg: a .deb is an ar archive whose data.tar.* member holds the files.
      local member tmp
      member=$(ar t "$f" | grep '^data\.tar') && tmp=$(mktemp -d) &&
        (cd "$tmp" && ar x "$f" "$member") && tar -xf "$tmp/$member" -C "$prefix" || return 1
      rm -rf "$tmp"
    fi
  done
  # Static OpenBLAS archives and documentation: not linked, 60 MB.
  rm -rf "$prefix/usr/share/doc" "$prefix/usr/share/man"
  rm -f "$prefix/usr/lib/$arch_dir/openblas-pthread/"*.a
}

if [ "${1:-}" = --unpack-only ]; then
  unpack "$2" "$3"
  exit $?
fi
stop_after=
case "${1:-}" in
  --configure-only) stop_after=configure ;;
  --build-only) stop_after=build ;;
  "") ;;
  *) echo "usage: $0 [--configure-only | --build-only | --unpack-only DEBS PREFIX]" >&2; exit 2 ;;
esac

build=${GPU_CHECK_BUILD:-$root/build-gpu}
out=${OUT:-$build/out}
logs=$build/logs
mkdir -p "$out" "$logs"
log=$out/gpu_check.log
: >"$log"
exec > >(tee -a "$log") 2>&1
t_start=$(date +%s)
stage() { echo; echo "=== [$(( $(date +%s) - t_start )) s] $*"; }
# Seconds one run may take: its own limit, cut so that `reserve` seconds stay for the stages
# after it before the whole check's deadline (GPU_CHECK_DEADLINE, default 450 s), never under 20.
limit() {
  local own=$1 reserve=$2 left
  left=$(( ${GPU_CHECK_DEADLINE:-450} - ($(date +%s) - t_start) - reserve ))
  [ "$left" -lt "$own" ] && own=$left
  [ "$own" -lt 20 ] && own=20
  echo "$own"
}

jobs=${GPU_CHECK_JOBS:-$(nproc)}
cuda_arch=${GPU_CHECK_ARCH:-90}
mode=${GPU_CHECK_MODE:-auto}
debs=${GPU_DEPS_DEBS:-$root/.gpu-deps/debs}
prefix=${GPU_DEPS_PREFIX:-$build/deps}
python=${PYTHON:-python3}
tests=(test_cuda_kernels test_cuda_attention test_cuda_cudnn test_nccl_comm)
benches=(bench_cuda bench_cuda_attention)
probe=bench_probe  # the device fit, after the benches

stage "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "nvidia-smi: not available"
echo "cores: $(nproc), cmake: $(cmake --version | head -1)"

# ---- dependencies -------------------------------------------------------------------------
stage "dependencies"
nvcc=${CUDACXX:-$(command -v nvcc || true)}
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -z "$nvcc" ]; then echo "gpu_check: no nvcc (set CUDACXX)"; exit 1; fi
cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
echo "nvcc: $nvcc ($("$nvcc" --version | tail -1))"

if [ ! -d "$prefix/usr" ] && ls "$debs"/*.deb >/dev/null 2>&1; then
  unpack "$debs" "$prefix" || { echo "gpu_check: could not unpack $debs"; exit 1; }
fi
extra_lib_dirs=()
cmake_args=()
if [ -d "$prefix/usr" ]; then
  echo "carried prefix: $prefix/usr"
  cmake_args+=("-DCMAKE_PREFIX_PATH=$prefix/usr"
               "-DCMAKE_LIBRARY_PATH=$prefix/usr/lib/$arch_dir/openblas-pthread")
  extra_lib_dirs+=("$prefix/usr/lib/$arch_dir" "$prefix/usr/lib/$arch_dir/openblas-pthread")
else
  echo "no carried prefix (scripts/gpu_deps.sh not run): the machine's own libraries only"
fi

# A library beside CUDA, or from the pip package PyTorch brings (which ships libX.so.N only).
# Prints "include_dir library_file" or nothing.
find_cuda_lib() {
  local header=$1 lib=$2 module=$3 d
  for d in "$cuda_home/include" "$cuda_home/targets/x86_64-linux/include" /usr/include; do
    if [ -f "$d/$header" ]; then
      local f
      f=$(ls "$cuda_home"/lib64/lib"$lib".so* "$cuda_home"/lib/lib"$lib".so* \
             /usr/lib/$arch_dir/lib"$lib".so* 2>/dev/null | head -1)
      [ -n "$f" ] && { echo "$d $f"; return; }
    fi
  done
  d=$("$python" -c "import os, $module as m; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])" 2>/dev/null)
  if [ -n "$d" ] && [ -f "$d/include/$header" ]; then
    local f
    f=$(ls "$d"/lib/lib"$lib".so* 2>/dev/null | head -1)
    [ -n "$f" ] && echo "$d/include $f"
  fi
}
read -r nccl_inc nccl_lib <<<"$(find_cuda_lib nccl.h nccl nvidia.nccl)"
if [ -z "${nccl_lib:-}" ]; then echo "gpu_check: NCCL not found (CUDA toolkit or pip nvidia-nccl)"; exit 1; fi
echo "NCCL: $nccl_lib"
cmake_args+=("-DNCCL_INCLUDE_DIR=$nccl_inc" "-DNCCL_LIBRARY=$nccl_lib")
extra_lib_dirs+=("$(dirname "$nccl_lib")")
read -r cudnn_inc cudnn_lib <<<"$(find_cuda_lib cudnn.h cudnn nvidia.cudnn)"
if [ -n "${cudnn_lib:-}" ]; then
  echo "cuDNN: $cudnn_lib"
  cmake_args+=("-DCUDNN_INCLUDE_DIR=$cudnn_inc" "-DCUDNN_LIBRARY=$cudnn_lib")
  extra_lib_dirs+=("$(dirname "$cudnn_lib")")
else
  echo "cuDNN: not found"
fi
# Transitive libraries (libfmt under libspdlog, libgfortran under OpenBLAS) are found through
# LD_LIBRARY_PATH: the build's RUNPATH covers direct ones only. Also needed while building,
# when test discovery runs the test binaries.
for d in "${extra_lib_dirs[@]}"; do LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; done
export LD_LIBRARY_PATH

# ---- configure ----------------------------------------------------------------------------
stage "configure ($mode)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
configure() {  # configure full|reduced
  local reduced=OFF
  [ "$1" = reduced ] && reduced=ON
  rm -rf "$build/cmake"
  # shellcheck disable=SC2086  # GPU_CHECK_CMAKE_ARGS is a list of arguments
  cmake -S "$root" -B "$build/cmake" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$cuda_arch" \
    -DDHP_GPU_CHECK_ONLY=$reduced -DDHP_MPI=OFF -DDHP_TESTS=ON -DDHP_BENCH=ON \
    "${cmake_args[@]}" ${GPU_CHECK_CMAKE_ARGS:-} >"$logs/configure_$1.log" 2>&1
}
built_as=
if [ "$mode" != reduced ] && configure full; then
  built_as=full
elif [ "$mode" != full ] && configure reduced; then
  built_as=reduced
  [ "$mode" = auto ] && echo "full configure failed (see $logs/configure_full.log): reduced build"
fi
if [ -z "$built_as" ]; then
  echo "gpu_check: configure failed"
  tail -30 "$logs"/configure_*.log
  exit 1
fi
grep "^-- dhp:" "$logs/configure_$built_as.log"
[ "$stop_after" = configure ] && { echo "configured ($built_as) in $build/cmake"; exit 0; }

# ---- build --------------------------------------------------------------------------------
stage "build (-j$jobs)"
available=$(cmake --build "$build/cmake" --target help 2>/dev/null)
targets=()
# The dhp executable too where the full tree is configured: the demo trains on the device.
for t in "${tests[@]}" "${benches[@]}" "$probe" dhp; do
  if grep -qE "^(\.\.\. )?$t(:| |$)" <<<"$available"; then targets+=("$t"); else echo "$t: no such target in this tree"; fi
done
if [ ${#targets[@]} -eq 0 ]; then echo "gpu_check: nothing to build"; exit 1; fi
keep_going=(-k 0)
[ ${#generator[@]} -eq 0 ] && keep_going=(-k)
cmake --build "$build/cmake" --target "${targets[@]}" -j "$jobs" -- "${keep_going[@]}" \
  >"$logs/build.log" 2>&1 || { echo "build failed for some targets:"; grep -E "error|FAILED" "$logs/build.log" | head -40; }
bin_of() { find "$build/cmake" -type f -name "$1" -perm -u+x | head -1; }
[ "$stop_after" = build ] && { for t in "${targets[@]}"; do echo "$t: $(bin_of "$t" || true)"; done; exit 0; }

# ---- tests --------------------------------------------------------------------------------
stage "tests"
summary=$out/tests_summary.txt
printf "%-22s %7s %7s %7s  %s\n" test passed failed skipped status >"$summary"
for t in "${tests[@]}"; do
  bin=$(bin_of "$t")
  if [ -z "$bin" ]; then printf "%-22s %7s %7s %7s  %s\n" "$t" - - - "not built" >>"$summary"; continue; fi
  rm -f "$logs/$t.json"
  timeout "$(limit "${GPU_CHECK_TEST_TIMEOUT:-180}" 200)" "$bin" --gtest_output="json:$logs/$t.json" >"$logs/$t.log" 2>&1
  rc=$?
  # Failures in full (with their messages), then gtest's closing lines.
  grep -E -B2 -A12 "Failure$|^\[  FAILED  \] [A-Za-z]" "$logs/$t.log" | head -150
  grep -E "^\[==========\]|^\[  PASSED  \]" "$logs/$t.log"
  "$python" - "$t" "$logs/$t.json" "$rc" >>"$summary" <<'PY'
import json, sys
name, path, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    suites = json.load(open(path))["testsuites"]
except (OSError, ValueError, KeyError):
    why = "timed out" if rc == 124 else f"no result (exit {rc})"
    print(f"{name:<22} {'-':>7} {'-':>7} {'-':>7}  {why}")
    sys.exit()
p = f = s = 0
for suite in suites:
    for case in suite.get("testsuite", []):
        if case.get("failures"):
            f += 1
        elif case.get("result") == "SKIPPED":
            s += 1
        else:
            p += 1
status = "ok" if rc == 0 and f == 0 else ("timed out" if rc == 124 else f"exit {rc}")
print(f"{name:<22} {p:>7} {f:>7} {s:>7}  {status}")
PY
done
cat "$summary"

# ---- the demo on the device ----------------------------------------------------------------
# Only the full build has dhp (the data path needs HDF5, OpenCV, SentencePiece and toml++).
# A short run of the demo config with train.device = cuda in bf16: the log's loss and
# evaluation lines show the trainer end to end on the GPU.
dhp_bin=$(bin_of dhp)
if [ -n "$dhp_bin" ]; then
  stage "demo: dhp train on the device (bf16, ${GPU_CHECK_DEMO_STEPS:-300} steps)"
  demo=$build/demo
  rm -rf "$demo"
  timeout "$(limit 120 240)" bash -c '
    "$1" data synth --out "$2/data" --train 2000 --val 100 &&
    "$1" train --config "$3/configs/demo.toml" --train.device=cuda --train.precision=bf16 \
      --train.steps="$4" --data.train="$2/data/train.jsonl" --data.val="$2/data/val.jsonl" \
      --data.tokenizer="$2/data/tokenizer.model" --checkpoint.dir="$2/ckpt" \
      --log.metrics="$2/metrics.jsonl"' \
    _ "$dhp_bin" "$demo" "$root" "${GPU_CHECK_DEMO_STEPS:-300}" >"$logs/demo.log" 2>&1
  echo "demo: exit $?"
  grep -E "\] \[[a-z]+\] .*(backend|step +[0-9]+/|eval val|done in)|\[error\]|error:" "$logs/demo.log" |
    tail -12
else
  echo "demo: no dhp binary in the $built_as build (the data libraries are missing): skipped"
fi

# ---- benches ------------------------------------------------------------------------------
stage "benches"
results=$out/bench.jsonl
: >"$results"
for b in "${benches[@]}"; do
  bin=$(bin_of "$b")
  if [ -z "$bin" ]; then echo "$b: not built"; continue; fi
  timeout "$(limit "${GPU_CHECK_BENCH_TIMEOUT:-150}" 90)" "$bin" >"$logs/$b.log" 2>&1
  rc=$?
  grep '^{' "$logs/$b.log" >>"$results"
  echo "$b: exit $rc, $(grep -c '^{' "$logs/$b.log") result line(s)"
  [ $rc -ne 0 ] && tail -20 "$logs/$b.log"
done

# ---- the device fits the planner ------------------------------------------------------------
# The device's rates op by op for the 7B decoder shape (GEMMs, attention per chunk size from 64
# to 16k tokens; one GPU: no ring transfer) as cost coefficients beside the built-in h200
# profile; then dhp plan's dhp / pow2 / static on the headline workload with the built-in and
# the fitted coefficients. The plan is a simulation: where this build has no dhp executable,
# the command to run on the build machine with the written file is printed instead.
stage "device fit: cost coefficients and the headline plan"
probe_bin=$(bin_of "$probe")
if [ -n "$probe_bin" ]; then
  timeout "$(limit 90 60)" "$probe_bin" --model-profile 7b --prior h200 --max-chunk 16384 --repeats 2 \
    --out "$out/coeffs.json" 2>&1 | tee "$logs/$probe.log"
  headline=(plan --model-profile 7b --world 64 --batch 512 --preset video-longtail --seed 1 --steps 2)
  if [ -n "$dhp_bin" ] && [ -f "$out/coeffs.json" ]; then
    for c in "--device h200" "--coeffs $out/coeffs.json"; do
      echo "dhp ${headline[*]} $c:"
      # shellcheck disable=SC2086  # $c is two words
      timeout "$(limit 60 40)" "$dhp_bin" "${headline[@]}" $c 2>&1 | tail -8
    done
  else
    echo "no dhp here: on the build machine, dhp ${headline[*]} --coeffs coeffs.json (from \$OUT)"
  fi
else
  echo "$probe: not built"
fi

stage "PyTorch on the same shapes"
timeout "$(limit "${GPU_CHECK_TORCH_TIMEOUT:-180}" 0)" "$python" "$root/scripts/gpu_torch_bench.py" "$results" |
  tee "$out/table.txt"
stage "done in $(( $(date +%s) - t_start )) s; results in $out"
cat "$summary"
