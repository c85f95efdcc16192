#!/usr/bin/env python3
"""Tokenizer encode throughput (issue 19): moert tokenize beside the
tokenizers library (Rust, through its Python package), same corpus, same
tokenizer.json, same thread count, interleaved rounds, medians.

The corpus is built from text Debian ships (every /usr/share/doc/*/copyright
file, in sorted order, one JSONL document each, repeated to --megabytes).
Before timing, the ids of both are compared on the whole corpus.
Usage (after scripts/setup.sh; needs PyPI tokenizers: bench/tokenizer.sh sets
up a venv): tokenizer_bench.py --moert build/tools/moert/moert
    --tokenizer tests/fixtures/tokenizers/llama3 [--threads 2] [--rounds 5]
"""
import argparse
import glob
import json
import os
import platform
import re
import statistics
import struct
import subprocess
import tempfile
import time

import tokenizers
from tokenizers import Tokenizer


def corpus(megabytes):
    docs = []
    for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
        with open(path, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        if text.strip():
            docs.append(text)
    out, size = [], 0
    while size < megabytes * 1e6:
        for d in docs:
            out.append(d)
            size += len(d.encode())
    return out


def npy_ints(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<H", data[8:10])[0]
    body = data[10 + n:]
    return struct.unpack("<%di" % (len(body) // 4), body)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moert", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--megabytes", type=float, default=20)
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"

    docs = corpus(args.megabytes)
    nbytes = sum(len(d.encode()) for d in docs)
    tmp = tempfile.mkdtemp(prefix="moe-tokbench-")
    jsonl = os.path.join(tmp, "corpus.jsonl")
    with open(jsonl, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    path = args.tokenizer
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    tok = Tokenizer.from_file(file)

    def run_moert():
        out = subprocess.run([args.moert, "tokenize", "--tokenizer", path, "--input", jsonl, "--output",
                              os.path.join(tmp, "data"), "--no-eos", "--threads", str(args.threads)],
                             check=True, capture_output=True, text=True).stderr
        return float(re.search(r"encoded in ([0-9.]+) s", out).group(1))

    # encode_batch_fast (tokenizers >= 0.20) skips the offsets moert does
    # not compute either: the library's fastest batch API.
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def run_tokenizers():
        start = time.perf_counter()
        encodings = encode(docs)
        return time.perf_counter() - start, encodings

    # Same ids before any timing counts.
    run_moert()
    _, encodings = run_tokenizers()
    ours = npy_ints(os.path.join(tmp, "data.tokens.npy"))
    theirs = [i for e in encodings for i in e.ids]
    if list(ours) != theirs:
        raise SystemExit("ids differ from tokenizers: not timing")
    moert_s, tok_s = [], []
    for _ in range(args.rounds):
        moert_s.append(run_moert())
        tok_s.append(run_tokenizers()[0])
    version = subprocess.run([args.moert, "--version"], capture_output=True, text=True).stdout.split("\n")
    m, t = statistics.median(moert_s), statistics.median(tok_s)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores; {version[1] if len(version) > 1 else ''}")
    print(f"tokenizer: {file}; corpus: {len(docs)} documents, {nbytes / 1e6:.1f} MB "
          f"(Debian's /usr/share/doc/*/copyright), {len(theirs)} tokens, ids identical")
    print(f"encode MB/s on {args.threads} threads, median of {args.rounds} interleaved rounds:")
    print(f"  moert tokenize        {nbytes / m / 1e6:8.2f}")
    print(f"  tokenizers {tokenizers.__version__:10s} {nbytes / t / 1e6:8.2f}  ({encode.__name__})")
    print(f"  moert / tokenizers    {t / m:8.2f}x")


if __name__ == "__main__":
    main()
