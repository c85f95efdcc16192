#!/usr/bin/env python3
"""init-weights.py PLAN OUT_DIR [--seed N] [--std X]

A randomly initialised Hugging Face checkpoint for training from scratch:
every weight of the single-rank plan PLAN (moec compile; an expert stack as
its per-expert tensors) written to OUT_DIR/model.safetensors in the plan's
dtype (F32 or BF16), initialised as transformers' _init_weights does:
matrices normal(0, std) with std the config's initializer_range (from
OUT_DIR/config.json, else --std, default 0.02), norm weights ones, biases
(and DeepSeek-V3's correction biases) zeros. Seeded (Python's random), the
same bytes for the same seed. Python standard library only.
"""
import argparse
import array
import json
import os
import random
import struct
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("plan")
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float)
    args = parser.parse_args()
    plan = json.load(open(args.plan))
    std = args.std
    config = os.path.join(args.out, "config.json")
    if std is None:
        std = json.load(open(config)).get("initializer_range", 0.02) if os.path.exists(config) \
            else 0.02
    rng = random.Random(args.seed)
    tensors = []
    for w in plan["weights"]:
        shape = w["shape"][1:] if w.get("experts") else w["shape"]
        names = ([w["name"].replace("{e}", str(e)) for e in range(w["experts"])]
                 if w.get("experts") else [w["name"]])
        if w["dtype"] not in ("F32", "BF16"):
            sys.exit(f"{args.plan}: '{w['name']}' is {w['dtype']}: expected F32 or BF16")
        for name in names:
            n = 1
            for d in shape:
                n *= d
            if len(shape) >= 2:
                values = array.array("f", (rng.gauss(0.0, std) for _ in range(n)))
            else:
                values = array.array("f", [1.0 if "norm" in name else 0.0] * n)
            raw = values.tobytes()
            if w["dtype"] == "BF16":  # round to nearest even
                words = array.array("I", raw)
                raw = array.array("H", (((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF
                                        for x in words)).tobytes()
            tensors.append((name, w["dtype"], shape, raw))
    header, offset = {}, 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model.safetensors")
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, raw in tensors:
            f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    print(f"{path}: {len(tensors)} tensors, {offset} bytes (seed {args.seed}, std {std})")


if __name__ == "__main__":
    main()
