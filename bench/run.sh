#!/usr/bin/env bash
# The CPU benchmark (issues 3 and 13): a random-weight model with
# ../shared/bench/bench-moe/config.json (Mixtral layout, ~640M parameters),
# in BF16 and F32, at 2 threads, moert interleaved with its peers in the same
# run (llama.cpp and PyTorch eager, fetched from PyPI and built into
# ~/.cache/moe-bench by bench/peers/setup.sh; their logits are checked against
# moert's first), medians of several rounds, each figure as a fraction of the
# machine's measured limits (FMA peak of the ISA level in use, STREAM triad),
# then moert beside one busy process, then routing + dispatch.
# Usage: bench/run.sh [BUILD_DIR] [--rounds N] [--no-peers] [--isa avx2]  (after scripts/setup.sh)
#   --no-peers: moert alone (no download, no peer build), e.g. offline.
#   --isa avx2: moert and its peers at the AVX2 level on a CPU that has more.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
args=()
peers=1
isa=native
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) args+=(--rounds "$2"); shift 2 ;;
    --no-peers) peers=0; args+=(--no-peers); shift ;;
    --isa) isa=$2; args+=(--isa "$2"); shift 2 ;;
    *) build=$1; shift ;;
  esac
done
config=${BENCH_CONFIG:-../shared/bench/bench-moe/config.json}
if [ "$peers" = 1 ]; then
  cache=$(bench/peers/setup.sh "$isa" | tail -1)
  python=$cache/venv/bin/python
else
  cache=/nonexistent
  python=python3
fi
"$python" bench/compare.py --build "$build" --cache "$cache" --config "$config" "${args[@]}"
echo
echo "== routing + dispatch at Mixtral-8x7B sizes (a GPU routing kernel: 1.2 M tokens/s)"
if [ "$isa" = avx2 ]; then export MOERT_ISA=avx2; fi
"$build/bench/moe-bench" routing --threads 2
