#!/usr/bin/env python3
"""compare-logits.py A.npy B.npy TOLERANCE: max |A - B| of two float32 .npy
files of one shape (moert run --logits-out), printed; exit 1 above TOLERANCE."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
from fixture_runs import read_npy  # noqa: E402


def main():
    (sa, a), (sb, b) = read_npy(sys.argv[1]), read_npy(sys.argv[2])
    tolerance = float(sys.argv[3])
    if sa != sb:
        print(f"FAIL shapes differ: {sa} vs {sb}")
        return 1
    diff = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    ok = diff <= tolerance and all(x == x for x in a)
    print(f"{'ok' if ok else 'FAIL'}: {sa[0]} rows x {sa[1]}, max |diff| {diff:.2e} "
          f"(tolerance {tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
