#!/usr/bin/env python3
"""deadline.py SECONDS CODE CMD ARGS...: run CMD with its stderr merged into
stdout, pass the output through, and succeed only if it ends within SECONDS
(a hang fails) with a nonzero exit status (CODE "nonzero") or exactly CODE.
Prints `ended with status S within SECONDS s` last.
"""
import subprocess
import sys
import time

limit, want, command = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
start = time.monotonic()
try:
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=limit)
except subprocess.TimeoutExpired as e:
    out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    sys.stdout.write(out)
    sys.exit(f"deadline: the command did not end within {limit:g} s (a hang)")
sys.stdout.write(run.stdout)
ok = run.returncode != 0 if want == "nonzero" else run.returncode == int(want)
if not ok:
    sys.exit(f"deadline: expected exit status {want} but got {run.returncode}")
print(f"ended with status {'nonzero' if want == 'nonzero' else want} within {limit:g} s "
      f"({time.monotonic() - start:.1f} s)")
