#!/usr/bin/env python3
"""check-gradients.py OURS.safetensors REFERENCE.safetensors [--rtol 1e-5]
                     [--fp32-error REFERENCE.json] [--exact SUBSTRING]

Compares the gradients `moert train --grads-out` wrote with a reference
(tests/fixtures/training/generate.py: torch autograd on transformers'
model): the same tensor names, shapes and F32 dtype, and per tensor the
relative norm error ||ours - ref|| / ||ref|| <= rtol (a reference that is
exactly zero must be exactly zero here too). With --fp32-error (the
generator's train_reference.json), a tensor whose float32 autograd is
itself further than rtol from the float64 reference (fp32_autograd_error:
a gradient that float32 arithmetic cannot give to rtol, such as OLMoE's
expert reached by one token with a small routing weight) may be as far as
that. With --exact, a tensor whose name contains SUBSTRING must equal the
reference bit for bit (DeepSeek-V3's correction biases after their
updates). Prints one line per tensor and a summary; exit 1 on any failure.
Python standard library only.
"""
import argparse
import json
import math
import struct
import sys


def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        if entry["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {entry['dtype']}, expected F32")
        data = raw[8 + n + begin:8 + n + end]
        out[name] = (entry["shape"], struct.unpack(f"<{len(data) // 4}f", data))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ours")
    parser.add_argument("reference")
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--fp32-error")
    parser.add_argument("--exact")
    args = parser.parse_args()
    ours, ref = read(args.ours), read(args.reference)
    fp32 = {}
    if args.fp32_error:
        fp32 = json.load(open(args.fp32_error))["fp32_autograd_error"]
    failed = 0
    for name in sorted(set(ours) | set(ref)):
        if name not in ours or name not in ref:
            print(f"FAIL {name}: only in {'the reference' if name in ref else 'ours'}")
            failed += 1
            continue
        (shape_a, a), (shape_b, b) = ours[name], ref[name]
        if shape_a != shape_b:
            print(f"FAIL {name}: shape {shape_a} vs {shape_b}")
            failed += 1
            continue
        diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
        norm = math.sqrt(sum(y * y for y in b))
        error = diff / norm if norm > 0 else diff
        exact = args.exact is not None and args.exact in name
        bound = 0.0 if exact else max(args.rtol, fp32.get(name, 0.0))
        bad = (a != b) if exact else (error > bound if norm > 0 else diff != 0)
        note = (", bit for bit" if exact else
                f", float32 autograd's own {fp32[name]:.2e}" if bound > args.rtol else "")
        print(f"{'FAIL' if bad else 'ok  '} {name}: relative error {error:.2e} (norm {norm:.4g}{note})")
        failed += bad
    print(f"{len(ref)} tensors, {'passed' if not failed else 'FAILED'}, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
