#!/usr/bin/env bash
# Issue 20: FP8 block-scaled weights against BF16 on the benchmark model
# (../shared/bench/bench-moe/config.json, Mixtral layout, 640M parameters),
# 2 threads: the same config with DeepSeek-V3's quantization_config added
# (e4m3 weights, 128 x 128 blocks; embeddings, norms and LM head stay
# BF16), random weights from moe-bench; BF16 and FP8 runs of `moe-bench
# run` interleaved for several rounds (medians), the FP8 / BF16 decode
# ratio, and the peak RSS of a moert run that touches every expert against
# the FP8 checkpoint's bytes + 64 MiB.
# Usage: bench/fp8.sh [BUILD_DIR] [--rounds N]   (~2 GB in $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
config=${BENCH_CONFIG:-../shared/bench/bench-moe/config.json}
work=$(mktemp -d "${TMPDIR:-/tmp}/moe-fp8-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 - "$config" "$work/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]}
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), moert: $("$build/tools/moert/moert" --version | grep 'cpu kernels')"
"$build/tools/moec/moec" compile "$config" --max-batch-tokens 512 -o "$work/bf16.plan"
"$build/tools/moec/moec" compile "$work/config.json" --max-batch-tokens 512 -o "$work/fp8.plan"
mkdir -p "$work/bf16" "$work/fp8"
"$build/bench/moe-bench" weights "$work/bf16.plan" "$work/bf16"
"$build/bench/moe-bench" weights "$work/fp8.plan" "$work/fp8"
for r in $(seq "$rounds"); do
  for kind in bf16 fp8; do
    "$build/bench/moe-bench" run "$work/$kind.plan" "$work/$kind" --threads 2 |
      sed -n "s/^\(prefill  512\|prefill  128\|decode   128\) tokens: *\([0-9.]*\) tok.*/$kind \1 \2/p" |
      tee -a "$work/figures"
  done
done
python3 - "$work/figures" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kind, *what, value = line.split()
    rows.setdefault(" ".join(what), {}).setdefault(kind, []).append(float(value))
print("== medians (tok/s)")
for what, kinds in rows.items():
    b, f = statistics.median(kinds["bf16"]), statistics.median(kinds["fp8"])
    print(f"{what:12s}  BF16 {b:8.1f}  FP8 {f:8.1f}  FP8/BF16 {f / b:.2f}x")
PY
echo "== peak RSS of an FP8 run touching every expert (16-token prompt, 40 new tokens)"
"$build/tools/moec/moec" compile "$work/config.json" --max-batch-tokens 16 --max-seq-len 64 \
  --max-sequences 1 -o "$work/small.plan"
tokens=$(python3 -c "print(','.join(str(i * 997 % 32000) for i in range(16)))")
/usr/bin/time -v "$build/tools/moert/moert" run "$work/small.plan" --weights "$work/fp8" \
  --tokens "$tokens" --max-new-tokens 40 2> "$work/time" > /dev/null
bytes=$(stat -c %s "$work/fp8/model.safetensors")
peak=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$work/time")
python3 -c "b, p = $bytes, $peak * 1024; print(f'peak RSS {p / 2**20:.0f} MiB, checkpoint {b / 2**20:.0f} MiB (FP8 weights + scales + BF16 embeddings/norms/head): {(p - b) / 2**20:+.0f} MiB, limit +64 MiB:', 'met' if p <= b + (64 << 20) else 'NOT met')"
