#!/usr/bin/env python3
"""gpu-run.py [--sm NN] GPUS COMMAND...: run an end-to-end check on real GPUs
(ctest label `gpu`). Exits 77 (ctest: skipped, not passed) unless /dev/nvidia0
and libcuda.so.1 exist, at least GPUS devices are visible (nvidia-smi -L)
and, with --sm, the first has that compute capability (90: sm_90);
otherwise runs COMMAND and exits with its status."""
import ctypes
import os
import subprocess
import sys

SKIP = 77


def skip(why):
    print("gpu-run: skipped: " + why)
    sys.exit(SKIP)


def main():
    args = sys.argv[1:]
    sm = None
    if args[0] == "--sm":
        sm, args = args[1], args[2:]
    need, command = int(args[0]), args[1:]
    if not os.path.exists("/dev/nvidia0"):
        skip("no GPU visible (/dev/nvidia0)")
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        skip("no CUDA driver (libcuda.so.1)")
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        count = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    except OSError:
        count = 1
    if count < need:
        skip(f"{need} GPUs needed, {count} visible")
    if sm is not None:
        query = ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", "0"]
        try:
            cap = subprocess.run(query, capture_output=True, text=True).stdout.strip()
        except OSError:
            cap = ""
        if cap.replace(".", "") != sm:
            skip(f"sm_{sm} needed, the GPU is compute capability {cap or 'unknown'}")
    sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
