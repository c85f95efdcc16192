#!/usr/bin/env python3
"""weights-close.py A.safetensors B.safetensors [--rtol 1e-5] [--skip SUBSTR]

Two safetensors files (moert train --weights-out) hold the same tensors
(names, dtypes, shapes) with values close: each tensor's relative error
norm |a - b| / |a| at most --rtol, except the tensors whose name contains a
--skip substring (each reported with its error, and the whole model's
relative error norm over every tensor printed too). F32 and BF16. Prints
one line per tensor over a tenth of the tolerance and a summary; exit 1 on
any failure. Standard library only.
"""
import argparse
import array
import json
import math
import struct
import sys


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        data = raw[8 + n + begin:8 + n + end]
        if entry["dtype"] == "F32":
            values = array.array("f", data)
        elif entry["dtype"] == "BF16":
            halves = array.array("H", data)
            values = array.array("f", struct.pack(f"<{len(halves)}I", *[h << 16 for h in halves]))
        else:
            sys.exit(f"{path}: '{name}' is {entry['dtype']}: expected F32 or BF16")
        out[name] = (entry["dtype"], entry["shape"], values)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--skip", action="append", default=[])
    args = parser.parse_args()
    a, b = load(args.a), load(args.b)
    if sorted(a) != sorted(b):
        sys.exit(f"the tensors differ: {sorted(set(a) ^ set(b))[:5]}")
    failed = 0
    total_diff = total_norm = 0.0
    for name in sorted(a):
        (da, sa, va), (db, sb, vb) = a[name], b[name]
        if (da, sa) != (db, sb):
            sys.exit(f"'{name}': {da} {sa} against {db} {sb}")
        diff = sum((x - y) ** 2 for x, y in zip(va, vb))
        norm = sum(x * x for x in va)
        total_diff += diff
        total_norm += norm
        error = math.sqrt(diff / norm) if norm > 0 else math.sqrt(diff)
        skipped = any(s in name for s in args.skip)
        if error > args.rtol and not skipped:
            failed += 1
            print(f"FAIL '{name}': relative error {error:.2e}")
        elif error > args.rtol / 10:
            print(f"{'skip' if skipped else 'ok  '} '{name}': relative error {error:.2e}")
    whole = math.sqrt(total_diff / total_norm) if total_norm > 0 else 0.0
    print(f"{len(a)} tensors, {'passed' if not failed else 'FAILED'}, {failed} over {args.rtol:g}; "
          f"the whole model's relative error {whole:.2e}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
