#!/usr/bin/env bash
# The CPU benchmark of issue 3: a random-weight model with
# ../shared/bench/bench-moe/config.json (Mixtral layout, ~640M parameters),
# in BF16 and F32, at 2 threads, idle and beside one busy process, with the
# machine's measured limits (FMA peak of the ISA level in use, STREAM triad). Usage: bench/run.sh [BUILD_DIR]  (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
config=${BENCH_CONFIG:-../shared/bench/bench-moe/config.json}
work=$(mktemp -d /tmp/moe-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
# A plan per weight dtype (the dtype is part of the plan).
for dtype in bf16 f32; do
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['torch_dtype']={'bf16':'bfloat16','f32':'float32'}[sys.argv[2]]; json.dump(c, open(sys.argv[3],'w'))" \
    "$config" "$dtype" "$work/config-$dtype.json"
  "$build/tools/moec/moec" compile "$work/config-$dtype.json" -o "$work/$dtype.plan" \
    --max-batch-tokens 512 --max-seq-len 1024 --max-sequences 1
done
echo "== machine"
lscpu | grep -E "Model name" || true
"$build/bench/moe-bench" machine --threads 2
# Peers (llama.cpp, PyTorch) are not measured by this script yet: no
# figure of theirs is printed rather than a remembered one (issue 13).
echo "moert $("$build/tools/moert/moert" --version | tail -1)"
for dtype in bf16 f32; do
  mkdir -p "$work/$dtype"
  "$build/bench/moe-bench" weights "$work/$dtype.plan" "$work/$dtype" --dtype "$dtype" > /dev/null
  echo "== moert $dtype"
  "$build/bench/moe-bench" run "$work/$dtype.plan" "$work/$dtype" --threads 2
  # The same with one competing busy process (a shell loop on a core of its
  # own choosing): the pool should keep at least 45% of the idle figures.
  echo "== moert $dtype, one competing busy process"
  sh -c 'while :; do :; done' &
  busy=$!
  "$build/bench/moe-bench" run "$work/$dtype.plan" "$work/$dtype" --threads 2 | grep -E "prefill|decode"
  kill "$busy"
  wait "$busy" 2>/dev/null || true
  rm -rf "${work:?}/$dtype"
done
echo "== routing + dispatch at Mixtral-8x7B sizes (a GPU routing kernel: 1.2 M tokens/s)"
"$build/bench/moe-bench" routing --threads 2
