#!/usr/bin/env python3
"""compare-safetensors.py DIR_A DIR_B: every tensor of two Hugging Face
checkpoint directories (model.safetensors, or the shards of
model.safetensors.index.json) has the same name, dtype, shape and bytes, and
config.json is byte-identical. Prints "N tensors identical" or the first
difference (exit 1). Standard library only.
"""
import json
import os
import struct
import sys


def tensors(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values()))
             if os.path.exists(index) else ["model.safetensors"])
    out = {}
    for name in files:
        raw = open(os.path.join(directory, name), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        for tensor, entry in header.items():
            begin, end = entry["data_offsets"]
            out[tensor] = (entry["dtype"], entry["shape"], raw[8 + n + begin:8 + n + end])
    return out


a_dir, b_dir = sys.argv[1:3]
a, b = tensors(a_dir), tensors(b_dir)
if sorted(a) != sorted(b):
    sys.exit(f"tensor names differ: only in {a_dir}: {sorted(set(a) - set(b))}, "
             f"only in {b_dir}: {sorted(set(b) - set(a))}")
for name in sorted(a):
    if a[name] != b[name]:
        sys.exit(f"tensor {name} differs: {a[name][:2]} vs {b[name][:2]}")
if open(os.path.join(a_dir, "config.json"), "rb").read() != open(os.path.join(b_dir, "config.json"), "rb").read():
    sys.exit("config.json differs")
print(f"{len(a)} tensors identical")
