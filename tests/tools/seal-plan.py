#!/usr/bin/env python3
"""seal-plan.py IN OUT: writes plan IN to OUT with its integrity seal
recomputed (tests that edit a plan to check moert's structural checks)."""
import sys

from plan_seal import seal

data = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(seal(data))
