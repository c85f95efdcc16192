#!/usr/bin/env python3
"""make-synthetic-checkpoint.py CONFIG_IN CONFIG_OUT_DIR [key=value ...] then
   make-synthetic-checkpoint.py --weights PLAN DIR [--shard-bytes N]

Synthetic models for memory tests and benchmarks (no real weights):
- `CONFIG_IN OUT_DIR key=value...` writes OUT_DIR/config.json: CONFIG_IN with
  the given fields replaced (integers, floats or strings);
- `--weights PLAN DIR` writes a Hugging Face checkpoint of every weight of
  the single-rank plan PLAN (moec compile; expert stacks expanded) into DIR:
  model.safetensors, or shards of at most --shard-bytes with
  model.safetensors.index.json. Values: a fixed pattern of small numbers
  (F32 or BF16, the plan's dtype), norms 1. Streams: memory stays small
  whatever the size. Python standard library only.
"""
import array
import json
import os
import struct
import sys


def pattern(dtype, norm):
    if norm:
        values = [1.0] * 4096
    else:
        values = [((i * 2654435761) % 2001 - 1000) * 2e-5 for i in range(4096)]
    raw = array.array("f", values).tobytes()
    if dtype == "BF16":
        raw = b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
    return raw


def tensors_of(plan):
    for w in json.load(open(plan))["weights"]:
        if "experts" in w:
            for e in range(w["experts"]):
                yield w["name"].replace("{e}", str(e)), w["dtype"], w["shape"][1:]
        else:
            yield w["name"], w["dtype"], w["shape"]


def write_file(path, tensors):
    header, offset = {}, 0
    for name, dtype, shape in tensors:
        n = {"F32": 4, "BF16": 2}[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for name, dtype, shape in tensors:
            begin, end = header[name]["data_offsets"]
            unit = pattern(dtype, name.endswith("norm.weight") or "norm" in name.split(".")[-2])
            left = end - begin
            while left:
                chunk = unit * max(1, min(left, 16 << 20) // len(unit))
                chunk = chunk[:left]
                f.write(chunk)
                left -= len(chunk)


def main():
    if sys.argv[1] != "--weights":
        config = json.load(open(sys.argv[1]))
        for item in sys.argv[3:]:
            key, value = item.split("=", 1)
            for parse in (int, float):
                try:
                    value = parse(value)
                    break
                except ValueError:
                    pass
            config[key] = value
        os.makedirs(sys.argv[2], exist_ok=True)
        json.dump(config, open(os.path.join(sys.argv[2], "config.json"), "w"), indent=1)
        return
    plan, out = sys.argv[2], sys.argv[3]
    limit = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--shard-bytes" else 1 << 62
    shards, size = [[]], 0
    for t in tensors_of(plan):
        n = {"F32": 4, "BF16": 2}[t[1]]
        for d in t[2]:
            n *= d
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    os.makedirs(out, exist_ok=True)
    if len(shards) == 1:
        write_file(os.path.join(out, "model.safetensors"), shards[0])
        return
    weight_map = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_file(os.path.join(out, name), shard)
        for t in shard:
            weight_map[t[0]] = name
    json.dump({"metadata": {}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)


main()
