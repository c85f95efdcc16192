#!/usr/bin/env python3
"""check-fixture.py [options] FIXTURE_DIR

Compiles FIXTURE_DIR/config.json with `moec compile`, runs `moert run` on the
prompts of FIXTURE_DIR/reference.json, and compares with what transformers
produced (tests/fixtures/generate.py): the logits of every prompt position
(max abs difference <= --tolerance) and the greedy continuation (identical,
--max-new-tokens tokens). Uses the Python standard library only.

  --batched           run all prompts in one moert call (one batch of
                      sequences of different lengths) instead of one by one
  --compile-args "…"  extra moec compile arguments (e.g. a small
                      --max-batch-tokens to force chunked prefill)
  --tokens-only       skip the logits comparison (for bf16 runs)
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

from fixture_runs import add_tool_arguments, read_npy


def main():
    parser = argparse.ArgumentParser()
    add_tool_arguments(parser)
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--compile-args", default="")
    parser.add_argument("--tokens-only", action="store_true")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--reference", choices=["logits", "f32compute", "bf16inputs", "int8", "w8a8"],
                        default="logits",
                        help="compare with the reference's own logits, or (bf16 fixtures) "
                             "with the same weights computed in float32, or in float32 "
                             "with every linear layer's input rounded to bf16, or (int8) "
                             "with the weights after int8 quantisation and their greedy tokens, or "
                             "(FP8 fixtures) with the activations quantised per 1x128 to e4m3")
    args = parser.parse_args()

    reference = json.load(open(os.path.join(args.fixture, "reference.json")))
    runs = reference["runs"]
    work = tempfile.mkdtemp(prefix="moe-e2e-")
    plan = os.path.join(work, "model.plan")
    subprocess.run([args.moec, "compile", os.path.join(args.fixture, "config.json"), "-o", plan,
                    "--max-seq-len", "64"] + shlex.split(args.compile_args), check=True)

    groups = [runs] if args.batched else [[r] for r in runs]
    failures = 0
    for group in groups:
        logits_path = os.path.join(work, "logits.npy")
        command = [args.moert, "run", plan, "--weights", args.fixture, "--ignore-eos",
                   "--max-new-tokens", str(args.max_new_tokens), "--threads", args.threads,
                   "--logits-out", logits_path]
        for r in group:
            command += ["--tokens", ",".join(map(str, r["input_ids"]))]
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL moert exited {out.returncode}: {out.stderr.strip()}")
            return 1
        lines = out.stdout.strip().splitlines()
        (_, vocab), got = read_npy(logits_path)
        row = 0
        for r, line in zip(group, lines):
            name = r["logits_file"].split("_")[0]
            tokens = [int(t) for t in line.split(",")] if line else []
            want = r.get(f"greedy_{args.reference}", r["greedy"])[: args.max_new_tokens]
            key = "logits_file" if args.reference == "logits" else f"logits_{args.reference}_file"
            shape, ref = read_npy(os.path.join(args.fixture, r[key]))
            n = shape[0] * shape[1]
            diff = max(abs(got[row * vocab + i] - ref[i]) for i in range(n))
            row += shape[0]
            ok_tokens = tokens == want
            ok_logits = args.tokens_only or diff <= args.tolerance
            status = "ok  " if ok_tokens and ok_logits else "FAIL"
            failures += status == "FAIL"
            print(f"{status} {name}: {len(r['input_ids'])} prompt tokens, max |logit diff| "
                  f"{diff:.2e} (tolerance {args.tolerance:g}), greedy "
                  f"{'identical' if ok_tokens else f'differs: {tokens} vs {want}'}")
    print(f"{sum(len(g) for g in groups) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
