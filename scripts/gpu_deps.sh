#!/usr/bin/env bash
# Run on the build machine (Debian 12, apt reachable), before a GPU check on a lent GPU machine
# that has CUDA, CMake and PyTorch but not this project's libraries and no network: fetches the
# Debian packages the GPU check build needs (scripts/gpu_check.sh, DHP_GPU_CHECK_ONLY) into
# .gpu-deps/debs (about 14 MB, ignored by git; the device tool carries it: carry
# [".gpu-deps/debs"]). gpu_check.sh unpacks them there with dpkg -x into a prefix of its own,
# never over /. Here this also unpacks them into .gpu-deps/prefix, so that the same build can
# be configured against the prefix alone (scripts/gpu_check.sh --configure-only).
#
# Only what the reduced build links: fmt, spdlog, GoogleTest (static), OpenBLAS (pthread
# flavour, with libgfortran it needs at run time), nlohmann_json and CLI11 (headers only).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$root/.gpu-deps}
pkgs=(libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libgtest-dev
      libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libgfortran5
      nlohmann-json3-dev libcli11-dev)

rm -rf "$dest/debs.new"
mkdir -p "$dest/debs.new"
# apt-get download writes into the current folder; as root it warns that the _apt user cannot
# write there, which is harmless.
(cd "$dest/debs.new" && apt-get download "${pkgs[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
n=$(ls "$dest/debs.new"/*.deb 2>/dev/null | wc -l)
if [ "$n" -ne "${#pkgs[@]}" ]; then
  echo "gpu_deps: got $n of ${#pkgs[@]} packages (apt-get update first?)" >&2
  exit 1
fi
rm -rf "$dest/debs"
mv "$dest/debs.new" "$dest/debs"

rm -rf "$dest/prefix"
"$root/scripts/gpu_check.sh" --unpack-only "$dest/debs" "$dest/prefix"
du -sh "$dest/debs" "$dest/prefix"
