#!/usr/bin/env bash
# Tokenizer encode throughput (issue 19): moert tokenize beside the Rust
# tokenizers library (PyPI `tokenizers`, in a venv under ~/.cache/moe-bench),
# same corpus, same tokenizer.json, 2 threads, interleaved rounds, medians;
# the ids of both are compared on the whole corpus first.
# Usage: bench/tokenizer.sh [BUILD_DIR] [--rounds N]   (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
rounds=5
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
venv=${MOE_BENCH_CACHE:-$HOME/.cache/moe-bench}/tokenizers-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q tokenizers==0.23.3
fi
for kind in llama3 qwen2 llama2; do
  echo "== $kind"
  "$venv/bin/python" bench/tokenizer_bench.py --moert "$build/tools/moert/moert" \
    --tokenizer "tests/fixtures/tokenizers/$kind" --threads 2 --rounds "$rounds"
done
