#!/usr/bin/env python3
"""check-load-rss.py --ranks N --bound-mib B [--full-bytes F] < STDERR_OF_MOERT

Reads the `moert: load: rank R: shard bytes S, RSS before X, peak RSS after
Y (+G bytes during load)` lines that `MOERT_LOAD_REPORT=1 moert run` prints
(one per rank) and checks, per rank, that loading grew the peak resident set
by at most the rank's own shard bytes plus B MiB (G <= S + B MiB), and, with
--full-bytes, that the rank holds less than the whole model (S < F: the
bound would not hold if the rank materialised every tensor). Prints one line
per rank. Python standard library only.
"""
import argparse
import re
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--ranks", type=int, required=True)
parser.add_argument("--bound-mib", type=float, required=True)
parser.add_argument("--full-bytes", type=int, default=0)
args = parser.parse_args()
line = re.compile(r"moert: load: rank (\d+): shard bytes (\d+), RSS before (\d+), peak RSS after "
                  r"(\d+) \(\+(-?\d+) bytes during load\)")
seen, failures = {}, 0
for text in sys.stdin:
    m = line.search(text)
    if m:
        seen[int(m.group(1))] = tuple(int(g) for g in m.groups()[1:])
for rank in range(args.ranks):
    if rank not in seen:
        print(f"FAIL rank {rank}: no load report")
        failures += 1
        continue
    shard, before, after, growth = seen[rank]
    bound = shard + args.bound_mib * (1 << 20)
    ok = growth <= bound and (not args.full_bytes or shard < args.full_bytes)
    failures += 0 if ok else 1
    print(f"{'ok  ' if ok else 'FAIL'} rank {rank}: peak RSS growth during load "
          f"{growth / (1 << 20):.1f} MiB {'<=' if growth <= bound else '>'} shard "
          f"{shard / (1 << 20):.1f} MiB + {args.bound_mib:g} MiB")
print(f"{args.ranks - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
