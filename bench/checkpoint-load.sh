#!/usr/bin/env bash
# Issue 6: peak RSS of loading one rank's slices vs that rank's shard bytes,
# on a generated sharded checkpoint of ~2.6 GB (not a test: too big for
# ctest; tests/e2e/checkpoint-memory.test checks the same at ~53 MB).
# A made-up Mixtral-layout model: hidden 1024, 48 experts of width 2048,
# 4 layers, vocab 32000, BF16 (1.3 G parameters); synthetic weights
# (tests/tools/make-synthetic-checkpoint.py), converted to a sharded
# checkpoint under EP=2 (`moert convert`, streaming), then loaded under EP=4
# (4 ranks under mpirun, each reading its boxes out of the EP=2 rank files).
# Every rank prints its peak-RSS growth during loading (MOERT_LOAD_REPORT=1).
# Usage: bench/checkpoint-load.sh [BUILD_DIR]  (needs ~5.5 GB in $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
moec="$build/tools/moec/moec"
moert="$build/tools/moert/moert"
work=$(mktemp -d "${TMPDIR:-/tmp}/moe-ckpt-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
gen=tests/tools/make-synthetic-checkpoint.py
python3 $gen tests/fixtures/models/mixtral/config.json "$work/hf" hidden_size=1024 \
  intermediate_size=2048 num_local_experts=48 num_hidden_layers=4 vocab_size=32000 \
  head_dim=64 num_attention_heads=16 num_key_value_heads=4 dtype=bfloat16 torch_dtype=bfloat16
"$moec" compile "$work/hf/config.json" -o "$work/one.plan" --max-seq-len 32
"$moec" compile "$work/hf/config.json" --world-size 2 --dp 2 --ep 2 -o "$work/ep2.plan" --max-seq-len 32
"$moec" compile "$work/hf/config.json" --world-size 4 --dp 4 --ep 4 -o "$work/ep4.plan" --max-seq-len 32
echo "== machine"
lscpu | grep -E "Model name" || true
grep MemTotal /proc/meminfo
echo "== generate (Hugging Face, 2 GB shards)"
start=$(date +%s)
python3 $gen --weights "$work/one.plan" "$work/hf" --shard-bytes 2000000000
echo "$(du -sb "$work/hf" | cut -f1) bytes in $(( $(date +%s) - start )) s"
echo "== moert convert (EP=2 plan), peak RSS of the process"
/usr/bin/time -f "convert: %e s, peak RSS %M KiB" env MOERT_PROGRESS=1 \
  "$moert" convert "$work/ep2.plan" --weights "$work/hf" --out "$work/ckpt"
ls -l "$work/ckpt"
echo "== load under EP=4 from the EP=2 checkpoint (4 ranks)"
mpirun --allow-run-as-root --oversubscribe -np 4 -x MOERT_LOAD_REPORT=1 -x MOERT_PROGRESS=1 \
  "$moert" run "$work/ep4.plan" --weights "$work/ckpt" --tokens 1,2,3 --max-new-tokens 1 \
  --threads 1 2> "$work/load.err" > /dev/null
grep "moert: load" "$work/load.err"
python3 tests/tools/check-load-rss.py --ranks 4 --bound-mib 32 < "$work/load.err"
echo "== load on one rank (everything) from the EP=2 checkpoint"
MOERT_LOAD_REPORT=1 "$moert" run "$work/one.plan" --weights "$work/ckpt" --tokens 1,2,3 \
  --max-new-tokens 1 --threads 2 2> "$work/one.err" > /dev/null
grep "moert: load" "$work/one.err"
python3 tests/tools/check-load-rss.py --ranks 1 --bound-mib 32 < "$work/one.err"
