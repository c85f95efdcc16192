#!/usr/bin/env bash
# One training step (forward, loss, backward; with --optimizer also the
# AdamW update) of the benchmark model (../shared/bench/bench-moe, BF16
# weights, random) on 512 tokens, 2 threads: moert train against PyTorch
# eager (transformers' Mixtral, autograd; torch.optim.AdamW) measured in the
# same run, beside the machine's FMA peak. The training issues' speed
# figures (docs/training.md). Needs bench/peers/setup.sh's venv for PyTorch
# (--no-peers: moert alone).
#
#   bench/train-step.sh [--seq-len 512] [--optimizer] [--no-peers]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
seq=512
peers=1
optimizer=0
while [ $# -gt 0 ]; do
  case $1 in
    --seq-len) seq=$2; shift 2 ;;
    --optimizer) optimizer=1; shift ;;
    --no-peers) peers=0; shift ;;
    *) echo "usage: bench/train-step.sh [--seq-len N] [--optimizer] [--no-peers]" >&2; exit 2 ;;
  esac
done
config=$root/../shared/bench/bench-moe/config.json
work=${MOE_BENCH_WORK:-/tmp/moe-bench-train}
mkdir -p "$work"
cache=${MOE_BENCH_CACHE:-$HOME/.cache/moe-bench}

echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
"$build/tools/moert/moert" --version | sed -n 2p
"$build/bench/moe-bench" machine --threads 2 | grep -i -E 'fma|triad' || true

if [ "$optimizer" = 1 ]; then
  # AdamW (torch's defaults; BF16 weights through f32 master weights).
  "$build/tools/moec/moec" compile "$config" --train --seq-len "$seq" --optimizer adamw \
    --lr 1e-4 -o "$work/train.plan"
else
  "$build/tools/moec/moec" compile "$config" --train --seq-len "$seq" -o "$work/train.plan"
fi
# The weights moe-bench writes for a plan of the same model.
"$build/tools/moec/moec" compile "$config" --max-seq-len "$seq" -o "$work/run.plan"
[ -f "$work/bf16/model.safetensors" ] ||
  { mkdir -p "$work/bf16" && "$build/bench/moe-bench" weights "$work/run.plan" "$work/bf16" --dtype bf16 > /dev/null; }
# Random token ids (seed 0), 4 windows' worth.
python3 - "$work/tokens.npy" "$seq" <<'PY'
import random, struct, sys
path, seq = sys.argv[1], int(sys.argv[2])
random.seed(0)
ids = [random.randrange(32000) for _ in range(4 * seq + 1)]
header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(ids)
header = header.ljust(64 * ((len(header) + 11) // 64 + 1) - 11) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    f.write(struct.pack("<%di" % len(ids), *ids))
PY

# moert: 4 micro-batches (forward + backward each; with --optimizer 4
# updates of one micro-batch each): a warm-up (the first touches every
# buffer), then the median of 3, as torch_bench.py times PyTorch.
if [ "$optimizer" = 1 ]; then
  "$build/tools/moert/moert" train "$work/train.plan" --weights "$work/bf16" --data "$work/tokens.npy" \
    --steps 4 --threads 2 --metrics-out "$work/metrics.jsonl" > /dev/null
else
  "$build/tools/moert/moert" train "$work/train.plan" --weights "$work/bf16" --data "$work/tokens.npy" \
    --micro-batches 4 --threads 2 --metrics-out "$work/metrics.jsonl" > /dev/null
fi
ours=$(python3 - "$work/metrics.jsonl" "$seq" <<'PY'
import json, sys
steps = sorted(json.loads(l)["seconds"] for l in open(sys.argv[1]).readlines()[1:])
print("%.2f %.4f" % (int(sys.argv[2]) / steps[1], steps[1]))
PY
)
echo "moert train: ${ours% *} tokens/s (median step ${ours#* } s), load $(cat /proc/loadavg | cut -d' ' -f1-3)"
if [ "$peers" = 1 ]; then
  torch=$("$cache/venv/bin/python" "$root/bench/peers/torch_bench.py" train "$config" \
    "$work/bf16/model.safetensors" "$work/tokens.npy" "$seq" --threads 2 \
    $([ "$optimizer" = 1 ] && echo --optimizer))
  echo "pytorch eager: $torch"
  python3 - "${ours% *}" "$torch" <<'PY'
import json, sys
ours, torch = float(sys.argv[1]), json.loads(sys.argv[2])["tokens_per_s"]
print("moert / pytorch: %.2fx" % (ours / torch))
PY
fi
