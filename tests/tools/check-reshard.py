#!/usr/bin/env python3
"""check-reshard.py [--mpirun M] FIXTURE_DIR LAYOUT [LAYOUT ...]

A sharded checkpoint written under one plan loads under any other. Compiles
FIXTURE_DIR/config.json under --write-layout (default "dp=2,ep=2"), converts the
Hugging Face checkpoint FIXTURE_DIR with `moert convert` twice: by one
process and rank by rank under `mpirun -np WORLD`, and checks that

  - the two conversions' rank files are byte-identical (the file names
    differ only in their generation tag) and their manifests name the same
    boxes, sizes and checksums;
  - for every LAYOUT ("single" or e.g. "dp=4,ep=4", "tp=2", "pp=2,dp=2,ep=2";
    the world size is dp x pp x tp), `moert run` with the sharded checkpoint
    gives logits (--logits-out .npy) byte for byte equal to the same
    layout's run with the Hugging Face checkpoint, and the same tokens. (Each
    layout is compared with itself: a multi-rank run sums partial results in
    another order than the single-rank one, so only same-layout runs are
    bitwise comparable.) The rank-by-rank conversion is loaded too, by the
    first LAYOUT.

Prints one "ok"/"FAIL" line per check. Python standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from fixture_runs import add_tool_arguments, fixture_prompts, mpirun_prefix


def main():
    parser = argparse.ArgumentParser()
    add_tool_arguments(parser, layouts=True, mpirun=True)
    parser.add_argument("--write-layout", default="dp=2,ep=2")
    args = parser.parse_args()
    reference, prompts = fixture_prompts(args.fixture)
    config = os.path.join(args.fixture, "config.json")
    work = tempfile.mkdtemp(prefix="moe-reshard-")
    failures = 0

    def check(ok, text):
        nonlocal failures
        failures += 0 if ok else 1
        print(("ok   " if ok else "FAIL ") + text, flush=True)

    def call(command):
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL {' '.join(command)}: exit {out.returncode}: {out.stderr.strip()[-2000:]}")
            sys.exit(1)
        return out.stdout

    def compile_plan(layout):
        name = layout.replace(",", "-").replace("=", "")
        plan = os.path.join(work, name + ".plan")
        options, world = [], 1
        if layout != "single":
            degrees = dict(item.split("=") for item in layout.split(","))
            for axis in ("dp", "pp", "tp"):
                world *= int(degrees.get(axis, 1))
            options = ["--world-size", str(world)]
            for axis, value in degrees.items():
                options += ["--" + axis, value]
        call([args.moec, "compile", config, "-o", plan, "--max-seq-len", "64"] + options)
        return name, plan, world

    def run(plan, world, weights, logits):
        command = [args.moert, "run", plan, "--weights", weights, "--ignore-eos",
                   "--max-new-tokens", "4", "--logits-out", logits, "--threads", "1"]
        for p in prompts:
            command += ["--tokens", p]
        if world > 1:
            command = mpirun_prefix(args.mpirun, world) + command
        return call(command)

    # Convert: one process, then rank by rank under mpirun.
    wname, wplan, wworld = compile_plan(args.write_layout)
    one, ranked = os.path.join(work, "one"), os.path.join(work, "ranked")
    call([args.moert, "convert", wplan, "--weights", args.fixture, "--out", one])
    call(mpirun_prefix(args.mpirun, wworld) + [args.moert, "convert", wplan, "--weights", args.fixture, "--out",
                ranked])

    def rank_files(d):
        return {f[:10]: os.path.join(d, f) for f in sorted(os.listdir(d)) if f.startswith("rank-")}

    a, b = rank_files(one), rank_files(ranked)
    same = sorted(a) == sorted(b) and all(open(a[k], "rb").read() == open(b[k], "rb").read()
                                          for k in a)
    check(same, f"convert {args.write_layout}: {len(a)} rank files written rank by rank under "
                f"mpirun == written by one process (byte-identical)")

    def strip_names(d):
        m = json.load(open(os.path.join(d, "manifest.json")))
        for f in m["files"]:
            f["name"] = f["name"][:10]
        for t in m["tensors"]:
            for box in t["boxes"]:
                box["file"] = box["file"][:10]
        return m["files"], m["tensors"]

    check(strip_names(one) == strip_names(ranked),
          f"convert {args.write_layout}: manifests record the same boxes, sizes and checksums")

    for i, layout in enumerate(args.layouts):
        name, plan, world = compile_plan(layout)
        hf_npy, sh_npy = (os.path.join(work, f"{name}-{w}.npy") for w in ("hf", "sharded"))
        hf_tokens = run(plan, world, args.fixture, hf_npy)
        sh_tokens = run(plan, world, one, sh_npy)
        same = open(hf_npy, "rb").read() == open(sh_npy, "rb").read() and hf_tokens == sh_tokens
        check(same, f"{layout}: {world} ranks, checkpoint of {args.write_layout} == Hugging Face "
                    f"checkpoint (logits bitwise, {os.path.getsize(hf_npy)} bytes; tokens)")
        if i == 0:
            rk_npy = os.path.join(work, f"{name}-ranked.npy")
            rk_tokens = run(plan, world, ranked, rk_npy)
            check(open(hf_npy, "rb").read() == open(rk_npy, "rb").read() and
                  hf_tokens == rk_tokens,
                  f"{layout}: checkpoint converted rank by rank == Hugging Face checkpoint")
    shutil.rmtree(work, ignore_errors=True)
    print(f"{len(args.layouts) + 3 - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


main()
