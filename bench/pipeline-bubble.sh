#!/usr/bin/env bash
# Issue 18: the 1F1B pipeline's bubble (docs/training.md, "Pipeline
# parallelism") measured against the model of equal stages,
# (pp - 1) / (m + pp - 1), and against moec --explain's time model: the
# benchmark model (../shared/bench/bench-moe) cut to L layers (default 7,
# where the layer split gives stages of nearly equal cost: [0, 4) and
# [4, 7) with the LM head; f32, random weights), micro-batches of one
# sequence of 128 tokens, m per update, one rank (one thread) against PP=2
# (two ranks of one thread each). Prints moec's prediction, each stage's
# share of its time spent waiting for its neighbours and the bubble moert
# measures (its "pipeline" lines: 1 - the stages' mean busy time / the first
# stage's steps' time), and the bubble the update times imply: 1 - (one
# rank's update / pp) / the pipeline's update.
#
#   bench/pipeline-bubble.sh [--layers L] [--micro-batches M] [--steps N]
#   (~4 min, ~13 GB with 7 layers)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOE_BUILD:-$root/build}
steps=4
micro=8
layers=7
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --micro-batches) micro=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    *) echo "usage: bench/pipeline-bubble.sh [--layers L] [--micro-batches M] [--steps N]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/moe-pipeline-bubble.XXXXXX")
trap 'rm -rf "$work"' EXIT
mpirun=${MOE_MPIRUN:-$(command -v mpirun)}

seq=128
# shellcheck source=bench/train-model.sh
. "$root/bench/train-model.sh"
train_model "$layers" "$seq" $((steps * micro))

train="--train --seq-len $seq --micro-batch-size 1 --optimizer adamw --global-batch-size $micro --zero 0"
"$build/tools/moec/moec" compile "$work/config.json" $train -o "$work/one.plan"
"$build/tools/moec/moec" compile "$work/config.json" $train --pp 2 --world-size 2 --explain \
  -o "$work/pp2.plan" | sed -n '/^  stage/,$p'

run="--weights $work/weights --data $work/tokens.npy --steps $steps --threads 1 --metrics-out"
"$build/tools/moert/moert" train "$work/one.plan" $run "$work/one.jsonl" > "$work/one.txt"
"$mpirun" --allow-run-as-root --oversubscribe -np 2 "$build/tools/moert/moert" train \
  "$work/pp2.plan" $run "$work/pp2.jsonl" > "$work/pp2.txt"
grep '^pipeline' "$work/pp2.txt"
python3 - "$work/one.jsonl" "$work/pp2.jsonl" "$micro" "$steps" "$work/pp2.txt" <<'PY'
import json, re, statistics, sys
def median(path):
    s = [json.loads(l)["seconds"] for l in open(path) if l.strip()][1:]
    return statistics.median(s)
one, pp2, m, steps = median(sys.argv[1]), median(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"update: one rank {one:.3f} s, PP=2 {pp2:.3f} s (medians after the first)")
print(f"bubble implied by the update times: {100 * (1 - one / 2 / pp2):.1f}%; "
      f"model of equal stages (pp - 1) / (m + pp - 1) = {100 / (m + 1):.1f}% for m = {m}")
# Unequal stages: the slowest stage sets the steady state, the others add
# their fill and drain once: (m - 1) max(t) + sum(t), t a stage's busy
# seconds per micro-batch (forward and backward).
busy = [float(x) for x in re.findall(r"busy ([0-9.]+) s", open(sys.argv[5]).read())]
t = [b / (steps * m) for b in busy]
model = (m - 1) * max(t) + sum(t)
print(f"stages' busy seconds per micro-batch: {', '.join(f'{x:.3f}' for x in t)}; "
      f"1F1B over them: (m - 1) max + sum = {model:.3f} s per update, measured {pp2:.3f} s "
      f"({100 * (pp2 - model) / model:+.1f}%)")
PY
