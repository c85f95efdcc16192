#!/usr/bin/env python3
"""expect-exit.py CODE CMD ARGS...: run CMD, pass its output through, and
succeed only if it exits with exactly CODE (lit's `not` accepts any failure).
"""
import subprocess
import sys

want = int(sys.argv[1])
proc = subprocess.run(sys.argv[2:])
if proc.returncode != want:
    sys.stderr.write(f"expect-exit: expected exit code {want} but got {proc.returncode}\n")
    sys.exit(1)
