#!/usr/bin/env bash
# Issue 20: int8 weights (moec compile --weight-format int8) on the benchmark
# model (../shared/bench/bench-moe/config.json, Mixtral layout, 640M
# parameters, random BF16 weights), 2 threads, beside llama.cpp's Q8_0 of
# the same weights and beside BF16 (moert and llama.cpp), in the same run:
# bench/compare.py --dtypes bf16,int8 (the peers from bench/peers/setup.sh,
# logits checked before any timing, interleaved rounds, medians, each figure
# against its bound).
# Usage: bench/int8.sh [BUILD_DIR] [--rounds N]
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
cache=$(bench/peers/setup.sh native | tail -1)
"$cache/venv/bin/python" bench/compare.py --build "$build" --cache "$cache" \
  --config "${BENCH_CONFIG:-../shared/bench/bench-moe/config.json}" --dtypes bf16,int8 --rounds "$rounds"
