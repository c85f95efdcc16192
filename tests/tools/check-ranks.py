#!/usr/bin/env python3
"""check-ranks.py [options] FIXTURE_DIR LAYOUT [LAYOUT ...]

Partitioned execution equals the single-rank run. Compiles FIXTURE_DIR's
config.json once for one rank and once per LAYOUT (e.g. "dp=2,ep=2",
"pp=2,tp=2,ep=2"; the world size is dp x pp x tp), runs the prompts of
FIXTURE_DIR/reference.json as one batch with `moert run` (the layouts under
`mpirun -np WORLD`), and checks for every layout:

  - the logits of every prompt position: max abs difference with the
    single-rank run <= --tolerance (default 1e-5);
  - the greedy continuations: identical;
  - `--report-memory`: every rank loaded exactly the weight bytes its plan
    slices predict, and its measured peak is within 10% of the predicted one.

  --capacity-factor F  compile every plan (the single-rank one too) with
                       capacity-limited dispatch; with --expect-drops the
                       single-rank logits must differ from a dropless run's
                       (tokens were really dropped)
                       (with dp > 1 the reference is a single-rank run of
                       each replica's prompts: capacity is per replica step)
  --compile-args "…"   extra moec compile arguments
  --mpirun-args "…"    extra mpirun arguments (e.g. "-x LD_LIBRARY_PATH" to
                       pass an environment variable to every rank)
  --step-rows N        dynamic FP8 activations: up to N logit rows (prompt
                       positions) may differ by up to 2e-2, the rest within
                       --tolerance. Each activation is rounded to e4m3, so
                       a last-bit difference upstream (TP's all_reduce adds
                       the partial sums in another order) can move one
                       activation by one e4m3 step
  --cuda-peak          the plans are CUDA plans run on the CUDA device: its
                       peak is its one arena (cuMemAlloc), which holds the
                       plan's predicted weights, buffers and KV caches plus
                       what only the CUDA kernel table knows of: its scratch,
                       the rope tables, the batch's four index arrays and
                       the all_gather staging. The measured peak is held to
                       the prediction plus those (each piece rounded up to
                       256 bytes), within the same 10%
Uses the Python standard library only.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

from fixture_runs import add_tool_arguments, fixture_prompts, mpirun_prefix, read_npy


def main():
    parser = argparse.ArgumentParser()
    add_tool_arguments(parser, layouts=True, mpirun=True)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--capacity-factor", default="")
    parser.add_argument("--expect-drops", action="store_true")
    parser.add_argument("--compile-args", default="")
    parser.add_argument("--mpirun-args", default="")
    parser.add_argument("--step-rows", type=int, default=0)
    parser.add_argument("--cuda-peak", action="store_true")
    parser.add_argument("--int8-block-edges", action="store_true",
                        help="int8 plans: a rank whose slice cuts a 128-column block reads the "
                             "rest of that block too (its scale is the whole block's), so it may "
                             "load more than its slices, up to twice as much")
    args = parser.parse_args()

    reference, prompts = fixture_prompts(args.fixture)
    work = tempfile.mkdtemp(prefix="moe-ranks-")
    config = os.path.join(args.fixture, "config.json")
    extra = shlex.split(args.compile_args) + ["--max-seq-len", "64"]
    capacity = ["--capacity-factor", args.capacity_factor] if args.capacity_factor else []

    def compile_plan(name, options):
        plan = os.path.join(work, name + ".plan")
        subprocess.run([args.moec, "compile", config, "-o", plan] + extra + options, check=True)
        return plan

    def run(plan, world, name, subset=None):
        logits = os.path.join(work, name + ".npy")
        command = [args.moert, "run", plan, "--weights", args.fixture, "--ignore-eos",
                   "--max-new-tokens", str(args.max_new_tokens), "--logits-out", logits,
                   "--report-memory", "--collective-timeout", "120"]
        command += ["--threads", "1" if world > 1 else "2"]
        for i, p in enumerate(prompts):
            if subset is None or i in subset:
                command += ["--tokens", p]
        if world > 1:
            command = mpirun_prefix(args.mpirun, world) + shlex.split(args.mpirun_args) + command
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL {name}: moert exited {out.returncode}: {out.stderr.strip()[-2000:]}")
            sys.exit(1)
        lines = out.stdout.strip().splitlines()
        tokens = lines[: len(prompts) if subset is None else len(subset)]
        memory = [l for l in lines if l.startswith("rank ")]
        return tokens, read_npy(logits)[1], memory

    single = compile_plan("single", capacity)
    base_tokens, base_logits, _ = run(single, 1, "single")
    lengths = [len(r["input_ids"]) for r in reference["runs"]]

    def per_replica(dp):
        """The single-rank runs of each replica's prompts (r, r + dp, ...),
        reassembled in prompt order: what a DP run must equal when capacity
        (a function of the step's tokens) drops tokens."""
        tokens, rows = [None] * len(prompts), [None] * len(prompts)
        for r in range(dp):
            subset = list(range(r, len(prompts), dp))
            if not subset:
                continue
            t, logits, _ = run(single, 1, f"replica{r}", subset)
            vocab = len(logits) // sum(lengths[i] for i in subset)
            at = 0
            for i, line in zip(subset, t):
                tokens[i] = line
                rows[i] = logits[at * vocab:(at + lengths[i]) * vocab]
                at += lengths[i]
        return tokens, [v for r in rows for v in r]
    if args.expect_drops:
        _, dropless, _ = run(compile_plan("dropless", []), 1, "dropless")
        gap = max(abs(a - b) for a, b in zip(base_logits, dropless))
        status = "ok  " if gap > 1e-3 else "FAIL"
        print(f"{status} capacity factor {args.capacity_factor} drops tokens: the single-rank "
              f"logits differ from the dropless run's by up to {gap:.2e}")
        if status == "FAIL":
            return 1

    def cuda_extra(plan, rank):
        """Bytes of the CUDA device's arena beyond the plan's prediction
        (--cuda-peak): the kernel table's scratch, rope tables (cos, sin),
        four [max_batch_tokens] int32 index arrays, the all_gather staging
        ([max_batch_tokens, width] f32), and with FP8 weights the scratch
        they are dequantised into (f32: the largest FP8 weight in the
        plan's F32, every expert at once within 256 MiB). F32 models only
        (16-bit GEMM weights would add their f32 copies)."""
        import json
        p = json.load(open(plan))
        own = p["programs"][p["ranks"][rank]["program"]]
        max_t = p["workload"]["max_batch_tokens"]
        align = lambda n: (n + 255) // 256 * 256
        extra = 4 * align(max_t * 4)
        fp8 = {w["name"] for w in p["ranks"][rank]["weights"] if w["dtype"] == "F8_E4M3"}
        # A program weight (an expert stack: its name with {e}) is FP8
        # when the rank's slices of it are.
        dequant = [w["bytes"] for w in own["weights"]
                   if any(re.fullmatch(re.escape(w["name"]).replace(r"\{e\}", r"\d+"), n)
                          for n in fp8)]
        extra += align(max(dequant + [0]))
        # With dynamic FP8 activations on sm_90 (the fake device's default;
        # MOE_FAKE_CUDA_SM=80 is not) FP8 GEMMs also hold cuBLASLt's 32 MiB workspace and the quantised
        # rows (e4m3 and their scales, f32 copies: a few [max_batch_tokens,
        # k] pieces, within the check's 10% next to the workspace).
        lt = (fp8 and p.get("fp8_activations") == "dynamic"
              and os.environ.get("MOE_FAKE_CUDA_SM", "90") == "90"
              and os.environ.get("MOERT_CUDA_FP8_GEMM") != "0")
        if lt:
            extra += 32 << 20
        # Each entry of the rank's stage (--decode-entry: prefill and
        # decode) has its own table and staging, for its own steps.
        for program in p["programs"]:
            if program["stage"] != own["stage"]:
                continue
            table, tokens = program["cuda"], program.get("max_batch_tokens", max_t)
            extra += sum(align(s["bytes"]) for s in table["scratch"])
            extra += sum(2 * align(r["positions"] * r["half"] * 4) for r in table["rope_tables"])
            gather = max([tokens * program["buffers"][s["out"][0]]["width"] * 4
                          for s in program["steps"] if s["op"] == "all_gather"] + [0])
            extra += align(gather)
        return extra

    failures = 0
    memory_line = re.compile(r"rank (\d+): weights loaded (\d+) bytes \(plan (\d+)\), peak "
                             r"measured ([\d.]+) MiB, predicted ([\d.]+) MiB")
    for layout in args.layouts:
        degrees = dict(item.split("=") for item in layout.split(","))
        world = 1
        for axis in ("dp", "pp", "tp"):
            world *= int(degrees.get(axis, 1))
        options = ["--world-size", str(world)] + capacity
        for axis, value in degrees.items():
            options += ["--" + axis, value]
        name = layout.replace(",", "-").replace("=", "")
        plan = compile_plan(name, options)
        tokens, logits, memory = run(plan, world, name)
        want_tokens, want_logits = base_tokens, base_logits
        if capacity and int(degrees.get("dp", 1)) > 1:
            want_tokens, want_logits = per_replica(int(degrees["dp"]))
        diff = max(abs(a - b) for a, b in zip(logits, want_logits)) if len(logits) == len(
            want_logits) else float("inf")
        same_tokens = tokens == want_tokens
        problems = []
        stepped, within = "", diff <= args.tolerance
        if args.step_rows and diff != float("inf") and diff > args.tolerance:
            vocab = len(logits) // sum(lengths)
            rows = [max(abs(a - b) for a, b in zip(logits[i:i + vocab], want_logits[i:i + vocab]))
                    for i in range(0, len(logits), vocab)]
            over = [r for r in rows if r > args.tolerance]
            rest = max([r for r in rows if r <= args.tolerance] + [0.0])
            stepped = f" ({len(over)} of {len(rows)} rows an e4m3 step away, the rest {rest:.2e})"
            within = len(over) <= args.step_rows and max(over) <= 2e-2
        if len(memory) != world:
            problems.append(f"{len(memory)} --report-memory lines for {world} ranks")
        worst = 0.0
        for line in memory:
            m = memory_line.match(line)
            if not m:
                problems.append(f"unreadable: {line}")
                continue
            rank, loaded, planned = int(m[1]), int(m[2]), int(m[3])
            measured, predicted = float(m[4]), float(m[5])
            if args.cuda_peak:
                predicted += cuda_extra(plan, rank) / (1 << 20)
            if args.int8_block_edges and planned <= loaded <= 2 * planned:
                pass
            elif loaded != planned:
                problems.append(f"rank {rank} loaded {loaded} weight bytes, the plan says {planned}")
            error = abs(measured - predicted) / predicted
            worst = max(worst, error)
            if error > 0.10:
                problems.append(f"rank {rank} peak {measured} MiB vs predicted {predicted} MiB")
        ok = within and same_tokens and not problems
        failures += not ok
        degrees_text = " ".join(f"{k}={v}" for k, v in degrees.items())
        print(f"{'ok  ' if ok else 'FAIL'} {degrees_text}: {world} ranks, max |logit diff| "
              f"{diff:.2e}{stepped} (tolerance {args.tolerance:g}), greedy "
              f"{'identical' if same_tokens else f'differs: {tokens} vs {want_tokens}'}, "
              f"weights loaded {'>=' if args.int8_block_edges else '='} plan, "
              f"peak within {100 * worst:.1f}% of predicted"
              + (" (+ CUDA arena extras)" if args.cuda_peak else "")
              + ("" if not problems else "; " + "; ".join(problems)))
    print(f"{len(args.layouts) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
