#!/usr/bin/env python3
"""shard-checkpoint.py SRC_DIR DST_DIR N [--dtype-of NAME]: rewrites
SRC_DIR/model.safetensors as N shards plus model.safetensors.index.json, the
way Hugging Face publishes large checkpoints (tensors in file order, split
by bytes). Standard library only."""
import json
import os
import shutil
import struct
import sys

src, dst, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst, exist_ok=True)
for extra in ("config.json", "reference.json"):
    if os.path.exists(os.path.join(src, extra)):
        shutil.copy(os.path.join(src, extra), dst)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
header.pop("__metadata__", None)
data = raw[8 + n:]
names = sorted(header, key=lambda k: header[k]["data_offsets"][0])
total = len(data)
shards = [[] for _ in range(count)]
for name in names:
    begin = header[name]["data_offsets"][0]
    shards[min(count - 1, begin * count // max(total, 1))].append(name)
weight_map = {}
for i, members in enumerate(shards):
    file = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
    out_header, blob = {}, b""
    for name in members:
        b, e = header[name]["data_offsets"]
        out_header[name] = dict(header[name], data_offsets=[len(blob), len(blob) + e - b])
        blob += data[b:e]
        weight_map[name] = file
    text = json.dumps(out_header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(dst, file), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)
for name in os.listdir(src):
    if name.endswith(".npy"):
        shutil.copy(os.path.join(src, name), dst)
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
          open(os.path.join(dst, "model.safetensors.index.json"), "w"), indent=2)
