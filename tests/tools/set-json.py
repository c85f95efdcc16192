#!/usr/bin/env python3
"""set-json.py IN OUT KEY=JSON [KEY=JSON ...]: writes the JSON object of IN to
OUT with the given top-level fields set (KEY=- removes KEY); a dotted KEY sets
a field of a nested object (rope_scaling.factor=2). A sealed plan
(tests/tools/plan_seal.py) is sealed anew. Standard library only."""
import json
import sys

from plan_seal import seal

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
sealed = isinstance(data, dict) and data.pop("integrity", None) is not None
text = json.dumps(data, indent=1).encode()
open(sys.argv[2], "wb").write(seal(text) if sealed else text)
