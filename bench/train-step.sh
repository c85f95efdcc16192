#!/usr/bin/env bash
# One training step (forward, loss, backward; with --optimizer also the
# AdamW update) of the benchmark model (../shared/bench/bench-moe, BF16
# weights, random) on 512 tokens, 2 threads: moert train against PyTorch
# eager (transformers' Mixtral, autograd; torch.optim.AdamW) measured in the
# same run, beside the machine's FMA peak. The training issues' speed
# figures (docs/training.md). Needs bench/peers/setup.sh's venv for PyTorch
# (--no-peers: moert alone).
#
#   bench/train-step.sh [--seq-len 512] [--optimizer] [--rounds 3] [--no-peers]
#                       [--tp-arithmetic L [--etp E] [--zero Z]]
#
# --tp-arithmetic L (with --optimizer): each round also times the plan
# compiled with moec's --tp-arithmetic L (and --etp E: the experts' slices
# over E of its ranks, default whole experts on each; --zero Z: whole
# experts' states sharded between the ranks) (the TP=L partition,
# its L ranks as threads of the one process, one thread each:
# docs/training.md, "The same bytes on every layout") and prints its cost
# against the plain plan.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
seq=512
peers=1
optimizer=0
rounds=3
arithmetic=0
etp=1
zero=0
while [ $# -gt 0 ]; do
  case $1 in
    --tp-arithmetic) arithmetic=$2; shift 2 ;;
    --etp) etp=$2; shift 2 ;;
    --zero) zero=$2; shift 2 ;;
    --seq-len) seq=$2; shift 2 ;;
    --optimizer) optimizer=1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --no-peers) peers=0; shift ;;
    *) echo "usage: bench/train-step.sh [--seq-len N] [--optimizer] [--rounds N] [--no-peers] [--tp-arithmetic L [--etp E] [--zero Z]]" >&2; exit 2 ;;
  esac
done
if [ "$arithmetic" != 0 ] && [ "$optimizer" != 1 ]; then
  echo "train-step: --tp-arithmetic goes with --optimizer (a TP plan trains with its optimizer)" >&2
  exit 2
fi
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
  if [ "$arithmetic" != 0 ]; then
    "$build/tools/moec/moec" compile "$config" --train --seq-len "$seq" --optimizer adamw \
      --lr 1e-4 --tp-arithmetic "$arithmetic" --etp "$etp" --zero "$zero" -o "$work/train-arithmetic.plan"
  fi
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

# One round: moert, 4 micro-batches (forward + backward each; with
# --optimizer 4 updates of one micro-batch each): a warm-up (the first
# touches every buffer), then the median of 3, as torch_bench.py times
# PyTorch; then PyTorch. Rounds alternate them, so that the VM's speed of
# the minute reaches both; the ratio of each round and the medians are
# printed at the end. With --optimizer PyTorch runs twice a round: its BF16
# model with torch.optim.AdamW on the bf16 parameters (bf16 moments), and
# the mixed precision moert trains in (f32 parameters and moments, the
# forward under torch.autocast's bf16: --f32-masters).
moert_round() {
  # (moert_round arithmetic: the --tp-arithmetic plan, its ranks one
  # thread each.)
  if [ "${1:-}" = arithmetic ]; then
    "$build/tools/moert/moert" train "$work/train-arithmetic.plan" --weights "$work/bf16" \
      --data "$work/tokens.npy" --steps 4 --threads 1 --metrics-out "$work/metrics.jsonl" > /dev/null
  elif [ "$optimizer" = 1 ]; then
    "$build/tools/moert/moert" train "$work/train.plan" --weights "$work/bf16" --data "$work/tokens.npy" \
      --steps 4 --threads 2 --metrics-out "$work/metrics.jsonl" > /dev/null
  else
    "$build/tools/moert/moert" train "$work/train.plan" --weights "$work/bf16" --data "$work/tokens.npy" \
      --micro-batches 4 --threads 2 --metrics-out "$work/metrics.jsonl" > /dev/null
  fi
  python3 - "$work/metrics.jsonl" "$seq" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = sorted(l["seconds"] for l in lines[1:])
print(json.dumps({"tokens_per_s": int(sys.argv[2]) / steps[1], "seconds": steps[1],
                  "first_loss": lines[0].get("loss")}))
PY
}
torch_round() {
  "$cache/venv/bin/python" "$root/bench/peers/torch_bench.py" train "$config" \
    "$work/bf16/model.safetensors" "$work/tokens.npy" "$seq" --threads 2 "$@"
}
results=$work/rounds.jsonl
: > "$results"
for ((round = 1; round <= rounds; round++)); do
  ours=$(moert_round)
  echo "round $round: moert train: $ours, load $(cut -d' ' -f1-3 /proc/loadavg)"
  arith=null
  if [ "$arithmetic" != 0 ]; then
    arith=$(moert_round arithmetic)
    echo "round $round: moert train, --tp-arithmetic $arithmetic --etp $etp --zero $zero: $arith"
  fi
  torch=null
  masters=null
  if [ "$peers" = 1 ]; then
    torch=$(torch_round $([ "$optimizer" = 1 ] && echo --optimizer))
    echo "round $round: pytorch eager: $torch"
    if [ "$optimizer" = 1 ]; then
      masters=$(torch_round --optimizer --f32-masters)
      echo "round $round: pytorch eager, f32 masters: $masters"
    fi
  fi
  echo "{\"moert\": $ours, \"arithmetic\": $arith, \"pytorch\": $torch, \"pytorch_f32_masters\": $masters}" >> "$results"
done
python3 - "$results" <<'PY'
import json, statistics, sys
rounds = [json.loads(l) for l in open(sys.argv[1])]
ours = [r["moert"]["tokens_per_s"] for r in rounds]
print("moert train: median %.1f tokens/s over %d rounds (%s)"
      % (statistics.median(ours), len(ours), " ".join("%.1f" % x for x in ours)))
if rounds[0].get("arithmetic"):
    arith = [r["arithmetic"]["tokens_per_s"] for r in rounds]
    ratios = [a / o for a, o in zip(arith, ours)]
    print("moert train, --tp-arithmetic: median %.1f tokens/s (%s); against the plain plan "
          "%.2fx, the median of the rounds' ratios (%s)"
          % (statistics.median(arith), " ".join("%.1f" % x for x in arith),
             statistics.median(ratios), " ".join("%.2fx" % r for r in ratios)))
if rounds[0]["pytorch"] is None:
    sys.exit(0)
# The same work first: moert's first step (mixed precision: bf16 products)
# and PyTorch's warm-up iteration (bf16 model) take the same window before
# any update; their losses agree to bf16's rounding.
peers = [("pytorch", "pytorch eager")]
if rounds[0].get("pytorch_f32_masters"):
    peers.append(("pytorch_f32_masters", "pytorch eager, f32 masters"))
for key, name in peers:
    a, b = rounds[0]["moert"]["first_loss"], rounds[0][key]["first_loss"]
    print("first loss: moert %.6f, %s %.6f (relative difference %.1e)"
          % (a, name, b, abs(a - b) / abs(b)))
    if abs(a - b) > 2e-2 * abs(b):
        sys.exit("train-step: the first losses differ by more than 2%: not the same work")
for key, name in peers:
    torch = [r[key]["tokens_per_s"] for r in rounds]
    ratios = [o / t for o, t in zip(ours, torch)]
    print("%s: median %.1f tokens/s (%s)" % (name, statistics.median(torch), " ".join("%.1f" % x for x in torch)))
    print("moert / %s: %.2fx, the median of the rounds' ratios (%s; lowest %.2fx)"
          % (name, statistics.median(ratios), " ".join("%.2fx" % r for r in ratios), min(ratios)))
PY
