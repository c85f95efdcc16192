#!/usr/bin/env bash
# Issue 17: the training planner's time model (moec compile --train
# --explain, docs/training.md "Choosing ZeRO and recompute") against the
# update times moert measures, layout by layout, on this machine: the
# benchmark model (../shared/bench/bench-moe) cut to 2 layers (209 M
# parameters, f32, random weights), 2 ranks under mpirun (one thread each),
# an update of 2 micro-batches of 256 tokens. For each layout: the model's
# seconds per update and its communication share, the measured median of
# the updates after the first, and their ratio; then whether the model
# orders the layouts as the measurements do.
#
#   bench/train-layout.sh [--steps N]   (~3 min, ~8 GB of memory, 1 GB in $TMPDIR)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOE_BUILD:-$root/build}
steps=4
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    *) echo "usage: bench/train-layout.sh [--steps N]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/moe-train-layout.XXXXXX")
trap 'rm -rf "$work"' EXIT
mpirun=${MOE_MPIRUN:-$(command -v mpirun)}

seq=256
# shellcheck source=bench/train-model.sh
. "$root/bench/train-model.sh"
train_model 2 "$seq" $((2 * steps))

train="--train --seq-len $seq --micro-batch-size 1 --optimizer adamw --global-batch-size 2 --recompute none"
layouts=("--dp 2 --ep 1 --zero 0" "--dp 2 --ep 1 --zero 1" "--dp 2 --ep 1 --zero 2"
         "--dp 2 --ep 2 --zero 0" "--dp 2 --ep 2 --zero 1" "--world-size 2 --tp 2 --zero 0")
: > "$work/figures.txt"
for layout in "${layouts[@]}"; do
  # shellcheck disable=SC2086
  "$build/tools/moec/moec" compile "$work/config.json" $train $layout --explain \
    -o "$work/layout.plan" > "$work/explain.txt"
  model=$(sed -n 's/^communication not overlapped: \([0-9.]*\)% of the update (\([0-9.e+-]*\) s of \([0-9.e+-]*\) s)$/\3 \1/p' "$work/explain.txt")
  "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$build/tools/moert/moert" train \
    "$work/layout.plan" --weights "$work/weights" --data "$work/tokens.npy" --steps "$steps" \
    --threads 1 --metrics-out "$work/metrics.jsonl" > /dev/null
  measured=$(python3 - "$work/metrics.jsonl" <<'PY'
import json, statistics, sys
s = [json.loads(l)["seconds"] for l in open(sys.argv[1])][1:]
print("%.4f" % statistics.median(s))
PY
)
  echo "$layout|$model|$measured" >> "$work/figures.txt"
done
python3 - "$work/figures.txt" <<'PY'
import sys
rows = []
for line in open(sys.argv[1]):
    layout, model, measured = line.rstrip("\n").split("|")
    seconds, comm = model.split()
    rows.append((layout, float(seconds), float(comm), float(measured)))
print("%-32s %12s %8s %12s %8s" % ("layout (2 ranks)", "model s", "comm %", "measured s", "m / model"))
for layout, model, comm, measured in rows:
    print("%-32s %12.3f %7.1f%% %12.3f %8.2f" % (layout, model, comm, measured, measured / model))
by_model = [r[0] for r in sorted(rows, key=lambda r: r[1])]
by_time = [r[0] for r in sorted(rows, key=lambda r: r[3])]
print("fastest by the model: %s; measured: %s" % (by_model[0], by_time[0]))
# Pairs the model orders as the measurements do (Kendall's agreement).
agree = total = 0
for i in range(len(rows)):
    for j in range(i + 1, len(rows)):
        total += 1
        agree += (rows[i][1] - rows[j][1]) * (rows[i][3] - rows[j][3]) > 0
print("pairs of layouts ordered alike: %d of %d" % (agree, total))
PY
