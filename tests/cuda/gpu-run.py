#!/usr/bin/env python3
"""gpu-run.py GPUS COMMAND...: run an end-to-end check on real GPUs (ctest
label `gpu`). Exits 77 (ctest: skipped, not passed) unless /dev/nvidia0 and
libcuda.so.1 exist and at least GPUS devices are visible (nvidia-smi -L);
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
    need, command = int(sys.argv[1]), sys.argv[2:]
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
    sys.exit(subprocess.run(command).returncode)


if __name__ == "__main__":
    main()
