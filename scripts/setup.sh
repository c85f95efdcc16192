#!/usr/bin/env bash
# Installs what is missing (Debian 12, as root or with sudo) and builds into
# build/ with Ninja and ccache. Idempotent: a second run installs nothing and
# rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build ccache g++ python3 pkg-config
          llvm-19-dev libmlir-19-dev mlir-19-tools llvm-19-tools
          libzstd-dev zlib1g-dev libedit-dev libcurl4-openssl-dev libffi-dev libxml2-dev
          libfmt-dev libgtest-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
          chromium
          libopenmpi-dev openmpi-bin
          clang-19 libclang-rt-19-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -G Ninja -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR="$(llvm-config-19 --cmakedir)/../mlir"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
