#!/usr/bin/env python3
"""The bytes of one rank's ZeRO-sharded AdamW moments (and, with --zero 2,
gradient sums) for a model checkpoint, computed from its tensors' shapes
alone (docs/training.md, "ZeRO"): a weight's state view is its elements as
rows of its last dimension; a weight the dp replicas share is split into
ceil(rows / dp) rows per replica; an expert stack under expert parallelism
is the rank's E / ep experts, split into ceil(rows / edp) rows over the
edp = dp / ep replicas that hold them (not split when edp is 1).

  zero-state-bytes.py MODEL.safetensors --dp N [--ep E] [--zero 1|2]

prints "moments B" and "sums B" (f32 bytes of one rank; every rank holds
the same sizes). Standard library only."""
import argparse
import json
import re
import struct


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--zero", type=int, default=1)
    a = ap.parse_args()
    with open(a.checkpoint, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    stacks = {}  # an expert stack: its experts' [rows, width]
    moments = sums = 0

    def shard(rows, width, members):
        per = -(-rows // members)
        return per * width * 4

    for name, t in header.items():
        shape = t["shape"]
        numel = 1
        for d in shape:
            numel *= d
        rows, width = numel // shape[-1], shape[-1]
        m = re.match(r"(.*\.experts)\.(\d+)\.(.*)", name)
        if m:
            stacks.setdefault((m.group(1), m.group(3)), []).append((rows, width))
            continue
        moments += 2 * shard(rows, width, a.dp)
        sums += shard(rows, width, a.dp if a.zero == 2 else 1)
    edp = a.dp // a.ep
    for experts in stacks.values():
        held = len(experts) // a.ep
        rows, width = experts[0][0] * held, experts[0][1]
        moments += 2 * shard(rows, width, edp)
        sums += shard(rows, width, edp if a.zero == 2 else 1)
    print("moments", moments)
    print("sums", sums)


if __name__ == "__main__":
    main()
