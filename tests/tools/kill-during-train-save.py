#!/usr/bin/env python3
"""kill-during-train-save.py TRIALS PLAN WEIGHTS DATA CKPT

`moert train --save` under SIGKILL: saves a training checkpoint CKPT (one
update of PLAN from WEIGHTS over DATA), then again and again resumes from it
for one more update and saves over it, killing moert with SIGKILL at a
random moment each time (seeded). After each trial CKPT must be a whole
training checkpoint, the previous one or the new one (manifest.json's
training step either), and a run must resume from it (every file present
with its recorded checksum, the state tensors read). Standard library
only."""
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

trials, plan, weights, data, ckpt = sys.argv[1:6]
rng = random.Random(4321)
scratch = tempfile.mkdtemp()


def step_of():
    return json.load(open(os.path.join(ckpt, "manifest.json")))["training"]["step"]


def resume(step, save=True):
    cmd = ["moert", "train", plan, "--resume", ckpt, "--data", data, "--steps", str(step + 1)]
    if save:
        return subprocess.Popen(cmd + ["--save", ckpt], stdout=subprocess.DEVNULL)
    return subprocess.run(cmd + ["--weights-out", os.path.join(scratch, "w.safetensors")],
                          capture_output=True, text=True)


subprocess.run(["moert", "train", plan, "--weights", weights, "--data", data, "--steps", "1",
                "--save", ckpt], check=True, stdout=subprocess.DEVNULL)
start = time.monotonic()
resume(1).wait()
full = time.monotonic() - start
killed = 0
for trial in range(int(trials)):
    before = step_of()
    proc = resume(before)
    time.sleep(rng.uniform(0.3 * full, 1.1 * full))  # the save comes last
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        killed += 1
    proc.wait()
    after = step_of()
    check = resume(after, save=False)
    if after not in (before, before + 1) or check.returncode != 0:
        print(f"FAIL trial {trial}: step {before} -> {after}: {check.stderr.strip()}")
        sys.exit(1)
print(f"{trials} saves, {killed} killed mid-way: the checkpoint always resumed "
      f"(at update {step_of()})")
