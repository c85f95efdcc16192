#!/usr/bin/env bash
# Sets up, builds, and runs the main job: compile the bundled tiny Mixtral
# (tests/fixtures/models/mixtral, random weights made with transformers) into
# a plan and run it on the CPU, printing the greedy continuation of two text
# prompts (its tokenizer.json: a small byte-level BPE; the weights are random,
# so the text is too).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
build=${BUILD_DIR:-build}
model=tests/fixtures/models/mixtral
"$build/tools/moec/moec" inspect "$model/config.json"
"$build/tools/moec/moec" compile "$model/config.json" -o "$build/mixtral.plan" --max-seq-len 64
echo "plan: $build/mixtral.plan"
echo "continuations (16 tokens each) of 'Hello world' and 'The program is free software' (random weights: random text):"
"$build/tools/moert/moert" run "$build/mixtral.plan" --weights "$model" \
  --prompt "Hello world" --prompt "The program is free software" --max-new-tokens 16
echo "the same as token ids (moert tokenize gives a prompt's ids):"
"$build/tools/moert/moert" tokenize --tokenizer "$model" "Hello world" "The program is free software"
"$build/tools/moert/moert" run "$build/mixtral.plan" --weights "$model" \
  --prompt "Hello world" --prompt "The program is free software" --max-new-tokens 16 --print-ids
# The same model on two ranks (expert parallelism across two data-parallel
# replicas, tokens exchanged by all-to-all) under Open MPI: the same tokens.
"$build/tools/moec/moec" compile "$model/config.json" -o "$build/mixtral-ep2.plan" --max-seq-len 64 \
  --world-size 2 --dp 2 --ep 2
echo "the same on 2 ranks (mpirun, dp=2 ep=2):"
mpirun --allow-run-as-root --oversubscribe -np 2 "$build/tools/moert/moert" run "$build/mixtral-ep2.plan" \
  --weights "$model" --prompt "Hello world" --prompt "The program is free software" \
  --max-new-tokens 16 --threads 1
