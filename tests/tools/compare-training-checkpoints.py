#!/usr/bin/env python3
"""compare-training-checkpoints.py CKPT_A CKPT_B: two training checkpoints of
`moert train --save` (docs/checkpoint-format.md, "Training checkpoints")
hold the same progress (step, data position) and byte-identical tensors: the
model's and the optimizer state's (AdamW's moments), each read through its
manifest's boxes. Prints "N tensors and M state tensors identical at update
S" or the first difference (exit 1). Standard library only."""
import json
import os
import struct
import sys


def load(directory):
    manifest = json.load(open(os.path.join(directory, "manifest.json")))
    raws = {}

    def data(entry):
        out = []
        for box in entry["boxes"]:
            if box["file"] not in raws:
                raws[box["file"]] = open(os.path.join(directory, box["file"]), "rb").read()
            raw = raws[box["file"]]
            n = struct.unpack("<Q", raw[:8])[0]
            begin, end = box["data_offsets"]
            out.append((box["offset"], raw[8 + n + begin:8 + n + end]))
        return entry["dtype"], entry["shape"], out

    training = manifest["training"]
    return ({t["name"]: data(t) for t in manifest["tensors"]},
            {t["name"]: data(t) for t in training["state"]},
            {k: v for k, v in training.items() if k != "state"})


a, b = load(sys.argv[1]), load(sys.argv[2])
if a[2] != b[2]:
    sys.exit(f"progress differs: {a[2]} vs {b[2]}")
for kind, x, y in (("tensor", a[0], b[0]), ("state tensor", a[1], b[1])):
    if sorted(x) != sorted(y):
        sys.exit(f"the {kind}s differ: {sorted(set(x) ^ set(y))[:5]}")
    for name in x:
        if x[name] != y[name]:
            sys.exit(f"{kind} '{name}' differs")
print(f"{len(a[0])} tensors and {len(a[1])} state tensors identical at update {a[2]['step']}")
