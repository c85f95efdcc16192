#!/usr/bin/env python3
"""check-train-loss.py [options] FIXTURE_DIR...

Compiles each FIXTURE_DIR/config.json with `moec compile --train` (the
sequence length and micro-batch size of FIXTURE_DIR/train_reference.json),
runs `moert train` on FIXTURE_DIR/train_tokens.npy (or --data) and compares
every micro-batch's cross-entropy, balancing loss, router z-loss and total
loss with what transformers computed (tests/fixtures/training/generate.py):
relative error <= --rtol (absolute --atol for a term that is 0). The total
is ce + aux_coef * aux + z_coef * z with the reference's terms and the
coefficients the plan was compiled with. Python standard library only.

  --compile-args "…"   extra moec compile arguments (--router-z-loss-coef Z,
                       --aux-loss-coef X: the expected coefficients follow)
  --data PATH          the token data to train on (default: the fixture's)
  --backward           compile with the backward pass (default --loss-only)
  --reference NAME     the reference file in FIXTURE_DIR (default
                       train_reference.json; train_capacity_reference.json:
                       compiled with its capacity_factor too)
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile



def option(args, name, default):
    words = shlex.split(args)
    return float(words[words.index(name) + 1]) if name in words else default


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--moec", default="moec")
    parser.add_argument("--moert", default="moert")
    parser.add_argument("--rtol", type=float, default=1e-6)
    parser.add_argument("--atol", type=float, default=1e-6)
    parser.add_argument("--compile-args", default="")
    parser.add_argument("--data")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--reference", default="train_reference.json")
    parser.add_argument("fixtures", nargs="+")
    args = parser.parse_args()
    failed = 0
    for fixture in args.fixtures:
        ref = json.load(open(os.path.join(fixture, args.reference)))
        capacity = (["--capacity-factor", str(ref["capacity_factor"])]
                    if "capacity_factor" in ref else [])
        aux_coef = option(args.compile_args, "--aux-loss-coef", ref["router_aux_loss_coef"])
        z_coef = option(args.compile_args, "--router-z-loss-coef", 0.0)
        with tempfile.TemporaryDirectory() as tmp:
            plan, metrics = os.path.join(tmp, "train.plan"), os.path.join(tmp, "m.jsonl")
            subprocess.run([args.moec, "compile", os.path.join(fixture, "config.json"), "--train",
                            "--seq-len", str(ref["seq_len"]), "--micro-batch-size",
                            str(ref["micro_batch_size"]), *capacity,
                            *shlex.split(args.compile_args),
                            *([] if args.backward else ["--loss-only"]),
                            "-o", plan], check=True)
            subprocess.run([args.moert, "train", plan, "--weights", fixture, "--data",
                            args.data or os.path.join(fixture, "train_tokens.npy"),
                            "--micro-batches", str(len(ref["micro_batches"])), "--threads", "2",
                            "--metrics-out", metrics], check=True, stdout=subprocess.DEVNULL)
            got = [json.loads(line) for line in open(metrics)]
        name = os.path.basename(os.path.normpath(fixture))
        for m, (r, g) in enumerate(zip(ref["micro_batches"], got)):
            # z is reported wherever router statistics are computed (either
            # coefficient > 0), aux where it is trained.
            expected = {"ce": r["ce"], "aux": r["aux"] if aux_coef > 0 else 0.0,
                        "z": r["z"] if z_coef > 0 or aux_coef > 0 else 0.0}
            expected["loss"] = r["ce"] + aux_coef * r["aux"] + z_coef * r["z"]
            bad = [f"{k} {g[k]!r} vs {v!r}" for k, v in expected.items()
                   if abs(g[k] - v) > max(args.rtol * abs(v), args.atol if v == 0 else 0.0)]
            print(f"{'FAIL' if bad else 'ok  '} {name} micro-batch {m}: " +
                  (", ".join(bad) if bad else
                   " ".join(f"{k} {g[k]:.6f}" for k in ("loss", "ce", "aux", "z"))))
            failed += bool(bad)
        if len(got) != len(ref["micro_batches"]):
            print(f"FAIL {name}: {len(got)} micro-batches, expected {len(ref['micro_batches'])}")
            failed += 1
    print(f"{'passed' if not failed else 'FAILED'}, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
