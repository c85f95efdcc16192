#!/usr/bin/env python3
"""Copy a model directory with one element of one f32 tensor moved by one
ulp (towards +inf): the smallest change a checkpoint can have, to measure
how far a training trajectory amplifies a rounding difference.

  nudge-weight.py MODEL_DIR OUT_DIR TENSOR [--index I]

OUT_DIR gets MODEL_DIR's config.json and a model.safetensors equal to its
own but for element I (default 0) of TENSOR. Standard library only."""
import argparse
import json
import math
import os
import shutil
import struct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("tensor")
    ap.add_argument("--index", type=int, default=0)
    a = ap.parse_args()
    src = os.path.join(a.model, "model.safetensors")
    with open(src, "rb") as f:
        data = bytearray(f.read())
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    t = header.get(a.tensor)
    if t is None or t["dtype"] != "F32":
        raise SystemExit(f"nudge-weight.py: {src}: no F32 tensor '{a.tensor}'")
    begin, end = t["data_offsets"]
    at = 8 + n + begin + 4 * a.index
    if a.index < 0 or at + 4 > 8 + n + end:
        raise SystemExit(f"nudge-weight.py: '{a.tensor}' has no element {a.index}")
    old = struct.unpack("<f", data[at:at + 4])[0]
    if not math.isfinite(old):
        raise SystemExit(f"nudge-weight.py: '{a.tensor}'[{a.index}] is {old}")
    # The next f32 towards +inf: one more in the magnitude's bits if
    # positive, one less if negative (-0.0 becomes the smallest subnormal).
    bits = struct.unpack("<I", data[at:at + 4])[0]
    if old < 0:
        bits -= 1
    elif bits == 0x80000000:
        bits = 1
    else:
        bits += 1
    data[at:at + 4] = struct.pack("<I", bits)
    os.makedirs(a.out, exist_ok=True)
    shutil.copy(os.path.join(a.model, "config.json"), os.path.join(a.out, "config.json"))
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(data)
    print(f"'{a.tensor}'[{a.index}]: {old!r} -> {struct.unpack('<f', data[at:at + 4])[0]!r}")


if __name__ == "__main__":
    main()
