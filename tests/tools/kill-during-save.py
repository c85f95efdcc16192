#!/usr/bin/env python3
"""kill-during-save.py TRIALS PLAN HF_DIR CKPT RUN_PLAN LOGITS_REF

Converts HF_DIR into the existing checkpoint CKPT again and again, killing
`moert convert` with SIGKILL at a random moment each time (seeded), and after
each kill checks that CKPT still loads and gives logits byte-identical to
LOGITS_REF (the previous checkpoint and the new one hold the same model).
Standard library only."""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

trials, plan, hf, ckpt, run_plan, ref = sys.argv[1:7]
rng = random.Random(1234)
# How long one save takes, to spread the kills over it.
start = time.monotonic()
subprocess.run(["moert", "convert", plan, "--weights", hf, "--out", ckpt], check=True)
full = time.monotonic() - start
killed = 0
for trial in range(int(trials)):
    proc = subprocess.Popen(["moert", "convert", plan, "--weights", hf, "--out", ckpt])
    time.sleep(rng.uniform(0, full * 1.2))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        killed += 1
    proc.wait()
    out = os.path.join(tempfile.mkdtemp(), "logits.npy")
    run = subprocess.run(["moert", "run", run_plan, "--weights", ckpt, "--tokens", "248,211,22,115,32",
                          "--max-new-tokens", "1", "--logits-out", out], capture_output=True, text=True)
    if run.returncode != 0 or open(out, "rb").read() != open(ref, "rb").read():
        print(f"FAIL trial {trial}: the checkpoint no longer loads the same: {run.stderr.strip()}")
        sys.exit(1)
print(f"{trials} saves, {killed} killed mid-way: the checkpoint always loaded identically")
