#!/usr/bin/env bash
# Gets the benchmark's peers onto this machine, idempotently, into a cache
# outside the repo (nothing of theirs is committed):
#   - a Python venv with PyTorch (eager, the PyPI wheel), transformers,
#     safetensors and gguf, pinned;
#   - llama.cpp from the source distribution of PyPI's llama-cpp-python
#     (its vendor/llama.cpp), built CPU-only with -DGGML_NATIVE=ON:
#     llama-bench, plus bench/peers/llama_logits.cpp linked to its libllama.
# usage: bench/peers/setup.sh [native|avx2]   (cache: $MOE_BENCH_CACHE, default ~/.cache/moe-bench)
#   avx2: llama.cpp built for AVX2 + FMA + F16C only (-DGGML_NATIVE=OFF), to
#   compare at the AVX2 level on a CPU that has more (bench/run.sh --isa avx2).
# Prints the cache directory on its last line.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${MOE_BENCH_CACHE:-$HOME/.cache/moe-bench}
llama_version=0.3.36
level=${1:-native}
case "$level" in
  native) native=ON; suffix= ;;
  avx2) native=OFF; suffix=-avx2 ;;
  *) echo "peers: unknown level '$level' (native or avx2)" >&2; exit 2 ;;
esac
mkdir -p "$cache"
cd "$cache"
log() { echo "peers: $*" >&2; }

# (A venv made before a package joined the list gets it too.)
if [ ! -f venv/.ready ] || ! venv/bin/python -c "import torch, transformers, safetensors, numpy, gguf" 2> /dev/null; then
  log "creating the Python venv (torch, transformers, gguf) in $cache/venv"
  python3 -m venv venv
  venv/bin/pip install -q torch==2.9.1 transformers==4.57.6 safetensors numpy gguf >&2
  touch venv/.ready
fi

src=llama_cpp_python-$llama_version/vendor/llama.cpp
if [ ! -d "$src" ]; then
  log "downloading llama-cpp-python $llama_version's source distribution (it vendors llama.cpp)"
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$llama_version" -d sdist >&2
  tar xzf "sdist/llama_cpp_python-$llama_version.tar.gz"
fi

# Native code depends on the CPU: one build per CPU flag set.
flags=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-8)
build=llama-build-$flags$suffix
if [ ! -x "$build/bin/llama-bench" ] || [ ! -x "$build/bin/llama-logits" ] ||
   [ "$repo/bench/peers/llama_logits.cpp" -nt "$build/bin/llama-logits" ]; then
  log "building llama.cpp (CPU only, $level; several minutes on 2 cores)"
  launcher=()
  command -v ccache > /dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=$native \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA=OFF "${launcher[@]}" > "$build.cmake.log" 2>&1 ||
    { cat "$build.cmake.log" >&2; exit 1; }
  cmake --build "$build" --target llama-bench -j "$(nproc)" > "$build.build.log" 2>&1 ||
    { tail -30 "$build.build.log" >&2; exit 1; }
  g++ -O2 -std=c++17 -I "$src/include" -I "$src/ggml/include" "$repo/bench/peers/llama_logits.cpp" \
    -o "$build/bin/llama-logits" -L "$build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$cache/$build/bin"
fi
ln -sfn "$build" "llama-build$suffix"
echo "$cache"
