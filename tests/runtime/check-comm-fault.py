#!/usr/bin/env python3
"""Checks that a rank that stalls or dies ends the whole MPI job, quickly and
with a message naming the rank and the step (MOERT_FAULT, runtime/src/Comm.cpp).

usage: check-comm-fault.py MPIEXEC COMM_TEST stall|kill

Runs `COMM_TEST --gtest_filter=CommFault.*` on 4 ranks with
MOERT_FAULT=<mode>:1:2 (rank 1 stalls or raises SIGKILL at its second call,
"fault step 2"); the test sets a 3 s collective timeout.
"""
import os
import re
import subprocess
import sys
import time

LIMIT_S = 40  # the job must end well before this (3 s timeout + start-up)


def main():
    mpiexec, binary, mode = sys.argv[1:4]
    env = dict(os.environ, MOERT_FAULT=f"{mode}:1:2")
    command = [mpiexec, "--allow-run-as-root", "--oversubscribe", "-np", "4", binary,
               "--gtest_filter=CommFault.*"]
    start = time.monotonic()
    try:
        run = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        sys.exit(f"FAIL: the job did not end within {LIMIT_S} s (a hang)\n{out}")
    elapsed = time.monotonic() - start
    out = run.stdout
    print(out)
    print(f"exit status {run.returncode} after {elapsed:.1f} s")
    if run.returncode == 0:
        sys.exit("FAIL: the job ended with status 0")
    if mode == "stall":
        # Some other rank times out in the step rank 1 never joins.
        pattern = (r"moert: error: rank [023]: fault step 2 \(all_reduce over world\) did not "
                   r"complete within 3 s \(group: ranks 0,1,2,3\)")
    else:
        # mpirun names the rank that died, and the injector said where.
        pattern = r"rank 1 raises SIGKILL at communication call 2 \(fault step 2"
    if not re.search(pattern, out):
        sys.exit(f"FAIL: no line matches /{pattern}/")
    if mode == "kill" and not re.search(r"rank 1 .*(signal 9|Killed)", out):
        sys.exit("FAIL: mpirun did not name rank 1 as killed")
    print("ok")


if __name__ == "__main__":
    main()
