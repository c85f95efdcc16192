#!/usr/bin/env python3
"""set-json.py IN OUT KEY=JSON [KEY=JSON ...]: writes the JSON object of IN to
OUT with the given top-level fields set (KEY=- removes KEY); a dotted KEY sets
a field of a nested object (rope_scaling.factor=2). Standard library only."""
import json
import sys

data = json.load(open(sys.argv[1]))
for assignment in sys.argv[3:]:
    key, value = assignment.split("=", 1)
    *path, last = key.split(".")
    target = data
    for part in path:
        target = target.setdefault(part, {})
    if value == "-":
        target.pop(last, None)
    else:
        target[last] = json.loads(value)
json.dump(data, open(sys.argv[2], "w"), indent=1)
