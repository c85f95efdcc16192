#!/usr/bin/env python3
"""check-conformance.py [options] ROOT FAMILY

Runs every case of the differential conformance fixtures
(tests/fixtures/conformance/generate.py) of one family under ROOT (v4 or v5:
the transformers version that saved them): `moec compile` of its config.json
then one batched `moert run` of its prompts, compared with what transformers
computed (max |logit diff| <= --tolerance on every prompt position, identical
greedy continuations).

A case may instead be refused: `moec compile` exits 2 with one line, e.g.
"...: not supported yet: FIELD = VALUE (...)". A refusal must be listed in
--refusals (a JSON object: case name -> text the message must contain, e.g.
"not supported yet: mlp_bias"), and every listed case of this family must be
refused; anything else fails. Plans are compiled for the longest prompt plus
its continuation.

  --layouts L [L ...]  also run --ranked cases of the family under each layout
                       with check-ranks.py (partitioned execution equals the
                       single-rank run)
  --ranked N           how many cases: the first in name order that ran and
                       that every layout can partition (e.g. tp=2 needs an
                       even number of KV heads)
Prints one line per case and "N passed, M failed". Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from fixture_runs import read_npy


def run_case(args, case_dir, work):
    """(status, detail): status ok / refused / FAIL."""
    reference = json.load(open(os.path.join(case_dir, "reference.json")))
    runs = reference["runs"]
    longest = max(len(r["input_ids"]) + len(r["greedy"]) for r in runs)
    plan = os.path.join(work, "model.plan")
    compiled = subprocess.run([args.moec, "compile", os.path.join(case_dir, "config.json"),
                               "-o", plan, "--max-seq-len", str(longest)],
                              capture_output=True, text=True)
    if compiled.returncode != 0:
        message = compiled.stderr.strip()
        if compiled.returncode == 2 and "\n" not in message:
            return "refused", message
        return "FAIL", f"moec exited {compiled.returncode}: {message}"
    logits_path = os.path.join(work, "logits.npy")
    new_tokens = len(runs[0]["greedy"])
    command = [args.moert, "run", plan, "--weights", case_dir, "--ignore-eos",
               "--max-new-tokens", str(new_tokens), "--threads", "1",
               "--logits-out", logits_path]
    for r in runs:
        command += ["--tokens", ",".join(map(str, r["input_ids"]))]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        return "FAIL", f"moert exited {out.returncode}: {out.stderr.strip()}"
    lines = out.stdout.strip().splitlines()
    (_, vocab), got = read_npy(logits_path)
    row, worst, problems = 0, 0.0, []
    for i, r in enumerate(runs):
        shape, ref = read_npy(os.path.join(case_dir, r["logits_file"]))
        n = shape[0] * shape[1]
        diff = max(abs(got[row * vocab + j] - ref[j]) for j in range(n))
        row += shape[0]
        worst = max(worst, diff)
        tokens = [int(t) for t in lines[i].split(",")] if i < len(lines) and lines[i] else []
        if tokens != r["greedy"]:
            problems.append(f"prompt {i} greedy {tokens} vs {r['greedy']}")
    if worst > args.tolerance:
        problems.append(f"max |logit diff| {worst:.2e} > {args.tolerance:g}")
    if problems:
        return "FAIL", "; ".join(problems)
    return "ok", f"max |logit diff| {worst:.2e}, greedy identical"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("family")
    parser.add_argument("--moec", default="moec")
    parser.add_argument("--moert", default="moert")
    parser.add_argument("--mpirun", default="mpirun")
    parser.add_argument("--refusals", required=True)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--layouts", nargs="*", default=[])
    parser.add_argument("--ranked", type=int, default=2)
    args = parser.parse_args()

    refusals = json.load(open(args.refusals))
    prefix = args.family + "-"
    cases = sorted(d for d in os.listdir(args.root)
                   if d.startswith(prefix) and os.path.isdir(os.path.join(args.root, d)))
    if not cases:
        print(f"FAIL no case of {args.family} under {args.root}")
        return 1
    work = tempfile.mkdtemp(prefix="moe-conformance-")
    passed = failed = 0
    runnable = []
    for case in cases:
        status, detail = run_case(args, os.path.join(args.root, case), work)
        expected = refusals.get(case)
        if status == "refused":
            if expected is None:
                status, detail = "FAIL", f"refused but not listed in --refusals: {detail}"
            elif expected not in detail:
                status, detail = "FAIL", f"refused without saying '{expected}': {detail}"
        elif expected is not None and status == "ok":
            status, detail = "FAIL", f"listed as refused ({expected}) but ran: {detail}"
        if status == "ok":
            runnable.append(case)
        ok = status in ("ok", "refused")
        passed += ok
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {case}: "
              f"{'refused: ' if status == 'refused' else ''}{detail}")
    def partitions(case):
        for layout in args.layouts:
            degrees = dict(item.split("=") for item in layout.split(","))
            world = 1
            for axis in ("dp", "pp", "tp"):
                world *= int(degrees.get(axis, 1))
            options = ["--world-size", str(world), "--gpu", "cpu"]
            for axis, value in degrees.items():
                options += ["--" + axis, value]
            out = subprocess.run([args.moec, "compile", os.path.join(args.root, case, "config.json"),
                                  "-o", os.path.join(work, "layout.plan"), "--max-seq-len", "64"]
                                 + options, capture_output=True, text=True)
            if out.returncode != 0:
                return False
        return True

    if args.layouts:
        here = os.path.dirname(os.path.abspath(__file__))
        ranked = [case for case in runnable if partitions(case)][:args.ranked]
        if len(ranked) < args.ranked:
            print(f"FAIL only {len(ranked)} cases can be partitioned as {' '.join(args.layouts)}")
            failed += 1
        for case in ranked:
            out = subprocess.run(
                [sys.executable, os.path.join(here, "check-ranks.py"), "--moec", args.moec,
                 "--moert", args.moert, "--mpirun", args.mpirun,
                 os.path.join(args.root, case)] + args.layouts,
                capture_output=True, text=True)
            ok = out.returncode == 0
            passed += ok
            failed += not ok
            summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
            print(f"{'ok  ' if ok else 'FAIL'} {case} under {' '.join(args.layouts)}: {summary}"
                  + ("" if ok else "\n" + out.stdout + out.stderr))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
