# Sourced by the training benchmarks (train-layout.sh, pipeline-bubble.sh):
# prints the machine, then writes into $work the benchmark model
# (../shared/bench/bench-moe) cut to LAYERS layers in f32 with random
# weights (config.json, run.plan, weights/) and WINDOWS random windows of
# SEQ + 1 tokens (tokens.npy). Needs $root, $build and $work.
#
#   train_model LAYERS SEQ WINDOWS
train_model() {
  local layers=$1 seq=$2 windows=$3
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
  "$build/tools/moert/moert" --version | sed -n 2p
  python3 - "$root/../shared/bench/bench-moe/config.json" "$work/config.json" "$layers" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_hidden_layers=int(sys.argv[3]), torch_dtype="float32")
json.dump(c, open(sys.argv[2], "w"), indent=2)
PY
  "$build/tools/moec/moec" compile "$work/config.json" --max-seq-len "$seq" -o "$work/run.plan"
  mkdir -p "$work/weights"
  "$build/bench/moe-bench" weights "$work/run.plan" "$work/weights" --dtype f32 > /dev/null
  python3 - "$work/tokens.npy" "$seq" "$windows" <<'PY'
import random, struct, sys
path, seq, windows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(0)
ids = [random.randrange(32000) for _ in range(windows * seq + 1)]
header = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % len(ids)
header = header.ljust(64 * ((len(header) + 11) // 64 + 1) - 11) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    f.write(struct.pack("<%di" % len(ids), *ids))
PY
}
