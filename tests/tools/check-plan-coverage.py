#!/usr/bin/env python3
"""check-plan-coverage.py PLAN: checks a plan's weight slices.

Every element of every checkpoint tensor must be owned by exactly as many
ranks as there are model replicas for it: DP for attention and dense parts,
EDP for routed experts (Megatron-Core's parallel folding). Checked on boxes:
distinct boxes of a tensor are disjoint, in bounds, each held by the same
number of ranks, and their volumes add up to the tensor. Also: no box is in
the vocabulary padding, and bytes are exact. Copies ("primary": false, e.g.
a norm on every TP rank) must repeat a box some rank owns. Standard library
only.
"""
import json
import sys
from collections import defaultdict

plan = json.load(open(sys.argv[1]))
d = plan["degrees"]
dp, edp = d["dp"], d.get("edp", 1)
sizes = {"F32": 4, "BF16": 2, "F16": 2, "FP8": 1, "F8_E4M3": 1}
ranks = {r["rank"]: r for r in plan["ranks"]}
boxes = defaultdict(lambda: defaultdict(int))  # name -> box -> owners
shapes, dtypes = {}, {}
problems = []
copies = []
for r in plan["ranks"]:
    weights = r["weights"] if "weights" in r else ranks[r["weights_of_rank"]]["weights"]
    for w in weights:
        shape, off, box = w["global_shape"], w["offset"], w["shape"]
        vol = 1
        for o, s, g in zip(off, box, shape):
            if o < 0 or s <= 0 or o + s > g:
                problems.append(f"{w['name']}: box {off}+{box} outside {shape}")
            vol *= s
        if w["bytes"] != vol * sizes[w["dtype"]]:
            problems.append(f"{w['name']}: {w['bytes']} bytes for {vol} {w['dtype']} elements")
        shapes[w["name"]] = shape
        if w.get("primary", True):
            boxes[w["name"]][(tuple(off), tuple(box))] += 1
        else:
            copies.append((w["name"], (tuple(off), tuple(box))))

def disjoint(a, b):
    return any(ao + asz <= bo or bo + bsz <= ao for ao, asz, bo, bsz in zip(a[0], a[1], b[0], b[1]))

expert_tensors = 0
for name, owned in boxes.items():
    numel = 1
    for g in shapes[name]:
        numel *= g
    expert = ".experts." in name
    expert_tensors += expert
    want = edp if expert else dp
    total = 0
    items = list(owned.items())
    for (box, count) in items:
        if count != want:
            problems.append(f"{name}: box {box} owned by {count} ranks, expected {want}")
        v = 1
        for s in box[1]:
            v *= s
        total += v
    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            if not disjoint(items[i][0], items[j][0]):
                problems.append(f"{name}: boxes {items[i][0]} and {items[j][0]} overlap")
    if total != numel:
        problems.append(f"{name}: boxes cover {total} of {numel} elements")

for name, box in copies:
    if box not in boxes[name]:
        problems.append(f"{name}: a copy of box {box} that no rank owns")

for p in problems[:20]:
    print("FAIL", p)
print(f"{len(boxes)} tensors ({expert_tensors} routed-expert) over {len(plan['ranks'])} ranks: "
      f"{'every element owned once per replica' if not problems else f'{len(problems)} problems'}")
sys.exit(1 if problems else 0)
