#!/usr/bin/env bash
# The README's second example: trains a small Mixtral-layout MoE (4 layers,
# hidden 128, 8 experts top-2: 3.4M parameters) from scratch on the CPU on a
# real English text that every Debian system ships (the GNU GPL v3,
# /usr/share/common-licenses/GPL-3 of base-files: "Everyone is permitted to
# copy and distribute verbatim copies of this license document"), with the
# bundled fixture's byte-level BPE tokenizer; trains half the updates and
# saves, resumes from the checkpoint for the rest, then generates text from
# the trained checkpoint with moert run: the license's opening line as the
# prompt (the model, 3.4M parameters trained on 16K tokens, has memorised
# its text from each window's start) and a phrase from inside the text
# (which it never saw at a sequence's start). STEPS (default 800) sets the
# updates, WORK_DIR where everything goes (default build/train-example);
# SKIP_SETUP=1 with MOEC / MOERT naming the tools skips ./scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  ./scripts/setup.sh
fi
build=${BUILD_DIR:-build}
moec=${MOEC:-$build/tools/moec/moec}
moert=${MOERT:-$build/tools/moert/moert}
work=${WORK_DIR:-$build/train-example}
steps=${STEPS:-800}
warmup=$(( steps / 20 > 0 ? steps / 20 : 1 ))
text=${TEXT:-/usr/share/common-licenses/GPL-3}
mkdir -p "$work/model"

# The model: the fixture Mixtral's config, grown to 4 layers of hidden 128.
python3 - "$work/model/config.json" <<'PY'
import json, sys
config = json.load(open("tests/fixtures/models/mixtral/config.json"))
config.update(hidden_size=128, intermediate_size=256, num_hidden_layers=4, head_dim=32,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              initializer_range=0.02)
open(sys.argv[1], "w").write(json.dumps(config, indent=1) + "\n")
PY
cp tests/fixtures/models/mixtral/tokenizer.json tests/fixtures/models/mixtral/tokenizer_config.json \
  "$work/model/"

# The training plan: 8 sequences of 128 tokens per update, AdamW with warmup
# and cosine decay, clipping; the optimizer is a compiled program beside the
# forward and backward.
"$moec" compile "$work/model/config.json" --train --seq-len 128 --micro-batch-size 8 \
  --optimizer adamw --lr 3e-3 --min-lr 3e-4 --lr-schedule cosine --warmup-steps "$warmup" \
  --lr-decay-steps "$steps" --adam-beta2 0.95 --weight-decay 0.1 --clip-grad-norm 1.0 \
  -o "$work/train.plan"
# Random initial weights (normal(0, 0.02), norms 1), seeded.
python3 scripts/init-weights.py "$work/train.plan" "$work/model" --seed 0
# The text as token data.
"$moert" tokenize --tokenizer "$work/model" --input "$text" --output "$work/text"

# Half the updates, saved every 50; then resumed from the checkpoint.
half=$((steps / 2))
every=$(( half / 5 > 0 ? half / 5 : 1 )) # the updates printed: the first and every `every`-th
echo "training $steps updates on $text (half, then resumed from the checkpoint):"
"$moert" train "$work/train.plan" --weights "$work/model" --data "$work/text.tokens.npy" \
  --steps "$half" --save "$work/ckpt" --save-every 50 --metrics-out "$work/first.jsonl" |
  awk -v every="$every" '$1 != "step" || $2 + 0 == 1 || ($2 + 0) % every == 0'
"$moert" train "$work/train.plan" --resume "$work/ckpt" --data "$work/text.tokens.npy" \
  --steps "$steps" --save "$work/ckpt" --metrics-out "$work/second.jsonl" |
  awk -v every="$every" '$1 == "step" && ($2 + 0) % every == 0'

# Text from the trained checkpoint (an ordinary sharded checkpoint).
"$moec" compile "$work/model/config.json" --max-seq-len 256 -o "$work/run.plan"
echo "greedy continuations from the trained model:"
"$moert" run "$work/run.plan" --weights "$work/ckpt" --tokenizer "$work/model" \
  --prompt "                    GNU GENERAL PUBLIC LICENSE" \
  --prompt "Everyone is permitted to copy" --max-new-tokens 48
