#!/usr/bin/env bash
# Sets up, builds, and runs the main job: compile the bundled tiny Mixtral
# (tests/fixtures/models/mixtral, random weights made with transformers) into
# a plan and run it on the CPU, printing the greedy continuation of two prompts.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
build=${BUILD_DIR:-build}
model=tests/fixtures/models/mixtral
"$build/tools/moec/moec" inspect "$model/config.json"
"$build/tools/moec/moec" compile "$model/config.json" -o "$build/mixtral.plan" --max-seq-len 64
echo "plan: $build/mixtral.plan"
echo "continuations (16 tokens each) of prompts [248,211,22,115,32] and [223,169,226,137,218,21,35,17,71]:"
"$build/tools/moert/moert" run "$build/mixtral.plan" --weights "$model" \
  --tokens 248,211,22,115,32 --tokens 223,169,226,137,218,21,35,17,71 --max-new-tokens 16
# The same model on two ranks (expert parallelism across two data-parallel
# replicas, tokens exchanged by all-to-all) under Open MPI: the same tokens.
"$build/tools/moec/moec" compile "$model/config.json" -o "$build/mixtral-ep2.plan" --max-seq-len 64 \
  --world-size 2 --dp 2 --ep 2
echo "the same on 2 ranks (mpirun, dp=2 ep=2):"
mpirun --allow-run-as-root --oversubscribe -np 2 "$build/tools/moert/moert" run "$build/mixtral-ep2.plan" \
  --weights "$model" --tokens 248,211,22,115,32 --tokens 223,169,226,137,218,21,35,17,71 \
  --max-new-tokens 16 --threads 1
