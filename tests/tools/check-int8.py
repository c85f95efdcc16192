#!/usr/bin/env python3
"""check-int8.py [options] FIXTURE_DIR

int8 weights against the same model in BF16 (docs/quantization.md): makes a
BF16 copy of the fixture (its F32 tensors rounded to nearest even; a BF16
fixture is used as it is), compiles it twice with `moec compile`, as stored
and with --weight-format int8, runs `moert run` on the prompts of
reference.json with both, and prints per prompt the max |logit difference|
of int8 against BF16 over every prompt position, the largest |logit| of the
BF16 run, and how many of the greedy tokens agree (the prefix up to the
first difference). Fails when a difference exceeds --bound. Uses the Python
standard library only.

  --compile-args "…"  extra moec compile arguments for both plans (a small
                      --max-batch-tokens prefills in chunks: the decode GEMV)
  --bound B           the largest max |logit difference| allowed
"""
import argparse
import array
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from fixture_runs import (add_tool_arguments, bf16_bits, read_npy, read_safetensors,
                          write_safetensors)


def bf16_copy(fixture, dst):
    """dst: the fixture with every F32 tensor rounded to BF16 (nearest even)."""
    os.makedirs(dst)
    config = json.load(open(os.path.join(fixture, "config.json")))
    config["dtype" if "dtype" in config else "torch_dtype"] = "bfloat16"
    json.dump(config, open(os.path.join(dst, "config.json"), "w"))
    header, data = read_safetensors(os.path.join(fixture, "model.safetensors"))
    metadata = header.pop("__metadata__", None)
    tensors = []
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        entry = header[name]
        b, e = entry["data_offsets"]
        dtype, chunk = entry["dtype"], bytes(data[b:e])
        if dtype == "F32":
            bits = array.array("I")
            bits.frombytes(chunk)
            chunk = array.array("H", [bf16_bits(v) for v in bits]).tobytes()
            dtype = "BF16"
        tensors.append((name, dtype, entry["shape"], chunk))
    write_safetensors(os.path.join(dst, "model.safetensors"), tensors, metadata)


def main():
    parser = argparse.ArgumentParser()
    add_tool_arguments(parser)
    parser.add_argument("--bound", type=float, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--compile-args", default="")
    parser.add_argument("--threads", default="2")
    args = parser.parse_args()

    reference = json.load(open(os.path.join(args.fixture, "reference.json")))
    runs = reference["runs"]
    work = tempfile.mkdtemp(prefix="moe-int8-")
    model = os.path.join(work, "bf16")
    config = json.load(open(os.path.join(args.fixture, "config.json")))
    if config.get("dtype", config.get("torch_dtype")) == "bfloat16":
        shutil.copytree(args.fixture, model)
    else:
        bf16_copy(args.fixture, model)

    results = {}
    for kind, extra in (("bf16", []), ("int8", ["--weight-format", "int8"])):
        plan = os.path.join(work, kind + ".plan")
        subprocess.run([args.moec, "compile", os.path.join(model, "config.json"), "-o", plan,
                        "--max-seq-len", "64"] + extra + shlex.split(args.compile_args),
                       check=True)
        logits = os.path.join(work, kind + ".npy")
        command = [args.moert, "run", plan, "--weights", model, "--ignore-eos",
                   "--max-new-tokens", str(args.max_new_tokens), "--threads", args.threads,
                   "--logits-out", logits]
        for r in runs:
            command += ["--tokens", ",".join(map(str, r["input_ids"]))]
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL moert ({kind}) exited {out.returncode}: {out.stderr.strip()}")
            return 1
        (_, vocab), values = read_npy(logits)
        results[kind] = (vocab, values, out.stdout.strip().splitlines())

    vocab, bf16, bf16_tokens = results["bf16"]
    _, int8, int8_tokens = results["int8"]
    failures, row = 0, 0
    for i, r in enumerate(runs):
        rows = len(r["input_ids"])
        span = range(row * vocab, (row + rows) * vocab)
        diff = max(abs(int8[j] - bf16[j]) for j in span)
        largest = max(abs(bf16[j]) for j in span)
        row += rows
        a = bf16_tokens[i].split(",") if i < len(bf16_tokens) else []
        b = int8_tokens[i].split(",") if i < len(int8_tokens) else []
        agree = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        status = "ok  " if diff <= args.bound else "FAIL"
        failures += status == "FAIL"
        print(f"{status} prompt{i}: {rows} prompt tokens, max |int8 - bf16| {diff:.3f} "
              f"(bound {args.bound:g}; |logits| up to {largest:.2f}), greedy agrees for "
              f"{agree}/{len(a)} tokens")
    print(f"{len(runs) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
