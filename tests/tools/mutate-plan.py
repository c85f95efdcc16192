#!/usr/bin/env python3
"""mutate-plan.py IN OUT STATEMENT: runs the Python STATEMENT on the plan IN
(`p`: the plan object, `q`: its programs[0]) and writes it to OUT, sealed
anew when IN was sealed (tests/tools/plan_seal.py). For error tests that
change a field inside an array, which set-json.py does not reach. Standard
library only."""
import json
import sys

from plan_seal import seal

p = json.load(open(sys.argv[1]))
q = p["programs"][0]
exec(sys.argv[3])
sealed = p.pop("integrity", None) is not None
text = json.dumps(p, indent=1).encode()
open(sys.argv[2], "wb").write(seal(text) if sealed else text)
