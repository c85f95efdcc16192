#!/usr/bin/env bash
# Issue 20: FP8 block-scaled weights against BF16 on the benchmark model
# (../shared/bench/bench-moe/config.json, Mixtral layout, 640M parameters),
# 2 threads: the same config with DeepSeek-V3's quantization_config added
# (e4m3 weights, 128 x 128 blocks; embeddings, norms and LM head stay
# BF16), random weights from moe-bench; BF16 and FP8 runs of `moe-bench
# run` interleaved for several rounds (medians), the FP8 / BF16 ratios, and
# the peak RSS of a moert run that touches every expert against the FP8
# checkpoint's bytes + 64 MiB.
# A round runs both models back to back, in alternating order (BF16 first
# in odd rounds, FP8 first in even ones), so that a drift of the machine's
# bandwidth (this project's VMs move by tens of percent within minutes)
# falls on both alike; the ratio printed is the median of the rounds'
# own ratios, with their range, beside the ratio of the medians. Decode
# is bound by the bytes of active weights a token reads: their ratio (BF16
# bytes / FP8 bytes, from moe-bench's GB/s figure) is printed as the
# bound.
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
  order="bf16 fp8"
  [ $((r % 2)) -eq 0 ] && order="fp8 bf16"
  for kind in $order; do
    "$build/bench/moe-bench" run "$work/$kind.plan" "$work/$kind" --threads 2 |
      sed -n "s/^\(prefill  512\|prefill  128\|decode   128\) tokens: *\([0-9.]*\) tok\/s\( (\([0-9.]*\) GB.*\)\?/$r $kind \1 \2 \4/p" |
      tee -a "$work/figures"
  done
done
python3 - "$work/figures" <<'PY'
import statistics, sys
rows, bytes_per_token = {}, {}
for line in open(sys.argv[1]):
    r, kind, what, n, value, *gbs = line.split()
    what = f"{what} {n}"
    rows.setdefault(what, {}).setdefault(kind, {})[r] = float(value)
    if gbs:  # decode: GB/s of active weights / tok/s = bytes a token reads
        bytes_per_token.setdefault(kind, []).append(float(gbs[0]) * 1e9 / float(value))
print(f"== medians (tok/s) and FP8/BF16: median of the {len(rows['decode 128']['bf16'])} rounds' own ratios [range], ratio of the medians")
for what, kinds in rows.items():
    b, f = statistics.median(kinds["bf16"].values()), statistics.median(kinds["fp8"].values())
    ratios = sorted(kinds["fp8"][r] / kinds["bf16"][r] for r in kinds["bf16"] if r in kinds["fp8"])
    print(f"{what:12s}  BF16 {b:8.1f}  FP8 {f:8.1f}  FP8/BF16 {statistics.median(ratios):.2f}x "
          f"[{ratios[0]:.2f}-{ratios[-1]:.2f}], of medians {f / b:.2f}x")
b, f = (statistics.median(bytes_per_token[k]) for k in ("bf16", "fp8"))
print(f"decode reads {b / 1e6:.0f} MB (BF16) and {f / 1e6:.0f} MB (FP8) of active weights a token: "
      f"bound on FP8/BF16 {b / f:.2f}x")
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
