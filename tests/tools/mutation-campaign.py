#!/usr/bin/env python3
"""mutation-campaign.py [--per-kind N] [--kinds K,...] [--seed S] [--jobs J]
                        [--keep DIR] [--build build] [--asan build-asan] [--fuzz build-fuzz]

Issue 11's acceptance count: N mutations (default 1000) of each input kind
(config, safetensors, index, manifest, plan) give no crash, no hang past
30 s and no run whose result differs from what the input means without
being rejected. moert runs from the ASan + UBSan build (scripts/asan.sh);
moec is not instrumented (MLIR is not), so a mutated config also goes
through the libFuzzer + ASan build of moec's config reader (scripts/fuzz.sh)
before moec compiles it. Standard library only; deterministic per --seed.

Every case is classified:
  rejected            exit 2 with a one-line "TOOL: ..." message on stderr
  same                accepted, the same tokens and logits as the oracle
  other model         accepted, a different result the input legitimately means
  FAILURE             a crash (signal, sanitizer report, exit not 0 or 2,
                      "internal error", "LLVM ERROR"), a hang (> 30 s), an
                      exit 2 without a message, or a silent change: accepted
                      with a result the oracle says it must not have

The oracles, per kind (the mixtral fixture; prompt 1,2,3,4,5, 4 greedy tokens):
  config       JSON edits (boundary values, wrong types, deleted, duplicated
               or unknown keys) and byte edits of config.json. Changing a
               config changes the model, so an accepted edit is "other
               model" except the neutral ones (re-indented, keys reordered,
               an unknown "_name_or_path" added), which must give the result
               of the unmutated config.
  safetensors  edits of the header and framing of model.safetensors (header
               JSON edits, swapped data_offsets, a wrong header length,
               truncation, bytes appended, header bytes flipped); never the
               data bytes (Hugging Face's format has no checksum: a flipped
               weight byte is a valid other checkpoint). A strict reader of
               the safetensors spec written here decides: a file it rejects
               must be rejected; a file it accepts is a valid (possibly
               other) checkpoint, rewritten canonically, and moert must give
               the same result on both files (or reject both).
  index        edits of model.safetensors.index.json of a 2-shard copy: the
               shards are unchanged, so an accepted index gives the baseline.
  manifest     edits of manifest.json of a sharded checkpoint (moert convert):
               the rank files are unchanged, so an accepted manifest gives
               the baseline.
  plan         edits of a compiled plan, half raw: the integrity seal must
               reject every one that changes a byte. The other half are
               resealed as a buggy moec would write them (steps dropped,
               swapped or duplicated, weight/buffer/cache ids changed, values
               replaced) to exercise the structural checks behind the seal
               (runtime/src/PlanChecks.cpp: every input comes from the step
               the plan names, weights bound once in order, ...): such a plan
               must be rejected or give the baseline, unless the edit changed
               a step's numeric attribute or eos_token_ids, which
               legitimately makes another model ("other model").
"""
import argparse
import concurrent.futures
import copy
import json
import os
import platform
import random
import shutil
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plan_seal import seal  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "models", "mixtral")
TOKENS = "1,2,3,4,5"
TIMEOUT = 30
ENV = dict(os.environ,
           ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1",
           UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
DTYPE_SIZE = {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "F16": 2, "BF16": 2, "I16": 2,
              "U8": 1, "I8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
BOUNDARY = [0, -1, 1, 2, 2**31, 2**31 - 1, 2**63, 2**64, -2**63, 1e308, -1e308, 0.5, 1e-300,
            "", "x", "F32", None, True, False, [], {}, [0], "x" * 100000]


# ------------------------------------------------------------ running

def run(cmd, cwd=None):
    """(classification, result): classification is 'ok', 'rejected' or a
    FAILURE text; result is (stdout, logits bytes) for 'ok'."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return "FAILURE hang", None
    err = p.stderr.decode(errors="replace")
    for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:", "internal error",
                "LLVM ERROR", "Assertion", "terminate called"):
        if bad in err:
            return f"FAILURE {bad}: {err.strip().splitlines()[-1][:200]}", None
    if p.returncode == 0:
        return "ok", p.stdout
    if p.returncode == 2:
        lines = [l for l in err.splitlines() if l.strip()]
        if not lines or ": " not in lines[0]:
            return "FAILURE exit 2 without a message", None
        return "rejected", None
    return f"FAILURE exit {p.returncode}: {err.strip()[-200:]}", None


def moert_run(tools, plan, weights, out_dir):
    logits = os.path.join(out_dir, "logits.npy")
    if os.path.exists(logits):
        os.remove(logits)
    status, stdout = run([tools.moert, "run", plan, "--weights", weights, "--tokens", TOKENS,
                          "--max-new-tokens", "4", "--ignore-eos", "--logits-out", logits])
    if status != "ok":
        return status, None
    return status, (stdout, open(logits, "rb").read())


# ------------------------------------------------------------ mutators

def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


def get(node, path):
    for p in path:
        node = node[p]
    return node


def mutate_json(doc, rng):
    """One random edit of a JSON document, in place; returns its path."""
    all_paths = [p for p in paths(doc) if p]
    path = rng.choice(all_paths)
    parent, key = get(doc, path[:-1]), path[-1]
    op = rng.randrange(7)
    value = parent[key]
    if op == 0:
        parent[key] = copy.deepcopy(rng.choice(BOUNDARY))
    elif op == 1 and isinstance(value, (int, float)) and not isinstance(value, bool):
        parent[key] = rng.choice([value + 1, value - 1, value * 2, -value, value / 3])
    elif op == 2:
        del parent[key]
    elif op == 3 and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(value))
    elif op == 4:
        other = rng.choice(all_paths)
        try:
            other_parent = get(doc, other[:-1])
            parent[key], other_parent[other[-1]] = other_parent[other[-1]], value
        except (KeyError, IndexError, TypeError):
            parent[key] = None
    elif op == 5 and isinstance(parent, dict):
        parent["unknown_field_%d" % rng.randrange(100)] = rng.choice(BOUNDARY[:12])
    else:
        parent[key] = str(value)[:50] if not isinstance(value, str) else 7
    return path


def mutate_bytes(data, rng):
    data = bytearray(data)
    op = rng.randrange(5)
    if op == 0 and data:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif op == 1:
        data = data[:rng.randrange(len(data) + 1)]
    elif op == 2:
        pos = rng.randrange(len(data) + 1)
        data[pos:pos] = bytes(rng.choice(b'{}[]",:0-e9 \n\x00\xff') for _ in range(rng.randint(1, 8)))
    elif op == 3:
        text = bytes(data)
        i = text.find(b'": ')
        if i > 0:  # a duplicate of the first key, with another value
            start = text.rfind(b'"', 0, i) + 1
            key = text[start - 1:i + 1]
            data = bytearray(text.replace(b"{", b"{" + key + b": 12345, ", 1))
    else:
        data = bytearray(b"[" * 100000 + b"]" * 100000)
    return bytes(data)


# ------------------------------------------------------------ safetensors

def parse_safetensors(raw):
    """The strict reader: (header dict, data) or None if the file breaks the
    spec (length, JSON, duplicate keys, dtypes, shapes, offsets that do not
    tile the data exactly)."""
    if len(raw) < 8:
        return None
    n = struct.unpack("<Q", raw[:8])[0]
    if n > len(raw) - 8 or n > 100 << 20:
        return None
    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=no_dups)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    data = raw[8 + n:]
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                return None
            continue
        # (Other keys in an entry are ignored, as the reference reader's
        # serde structs ignore them.)
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            return None
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZE or not isinstance(shape, list) \
                or not isinstance(offsets, list):
            return None
        if not all(type(d) is int and d >= 0 for d in shape):
            return None
        if len(offsets) != 2 or not all(type(o) is int for o in offsets):
            return None
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= offsets[0] <= offsets[1] or offsets[1] - offsets[0] != numel * DTYPE_SIZE[dtype]:
            return None
        spans.append(tuple(offsets))
    spans.sort()
    end = 0
    for b, e in spans:
        if b != end:
            return None
        end = e
    if end != len(data):
        return None
    return header, data


def canonical_safetensors(header, data):
    """The tensors the strict reader read, rewritten in order of their
    offsets with a fresh header."""
    entries = sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                     key=lambda kv: kv[1]["data_offsets"][0])
    out, blob = {}, bytearray()
    for name, entry in entries:
        b, e = entry["data_offsets"]
        out[name] = {"dtype": entry["dtype"], "shape": entry["shape"],
                     "data_offsets": [len(blob), len(blob) + e - b]}
        blob += data[b:e]
    text = json.dumps(out).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(blob)


# ------------------------------------------------------------ kinds

def case_config(tools, base, rng, work):
    text = open(os.path.join(FIXTURE, "config.json"), "rb").read()
    doc = json.loads(text)
    r = rng.random()
    neutral = r < 0.1
    if neutral:
        items = list(doc.items())
        rng.shuffle(items)
        doc = dict(items)
        if rng.random() < 0.5:
            doc["_name_or_path"] = "somewhere/else"
        data = json.dumps(doc, indent=rng.choice([None, 1, 4])).encode()
    elif r < 0.6:
        mutate_json(doc, rng)
        data = json.dumps(doc).encode()
    else:
        data = mutate_bytes(text, rng)
    config = os.path.join(work, "config.json")
    open(config, "wb").write(data)
    status, _ = run([tools.fuzz_config, config])
    if status.startswith("FAILURE"):
        return status + " (the config reader under ASan)"
    plan = os.path.join(work, "model.plan")
    status, _ = run([tools.moec, "compile", config, "-o", plan, "--max-seq-len", "32"])
    if status != "ok":
        return status
    status, result = moert_run(tools, plan, FIXTURE, work)
    if status != "ok":
        return status
    if result == base["plain"]:
        return "same"
    return "FAILURE silent change (a neutral edit)" if neutral else "other model"


def case_safetensors(tools, base, rng, work):
    raw = open(os.path.join(FIXTURE, "model.safetensors"), "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    r = rng.random()
    if r < 0.5:
        tensors = [k for k in header if k != "__metadata__"]
        if rng.random() < 0.3:  # swap the data of two tensors of one size
            a = rng.choice(tensors)
            same = [k for k in tensors if k != a and header[k]["data_offsets"][1] -
                    header[k]["data_offsets"][0] == header[a]["data_offsets"][1] -
                    header[a]["data_offsets"][0]]
            if same:
                b = rng.choice(same)
                header[a]["data_offsets"], header[b]["data_offsets"] = \
                    header[b]["data_offsets"], header[a]["data_offsets"]
        else:
            mutate_json(header, rng)
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        mutated = struct.pack("<Q", len(text)) + text + data
    elif r < 0.7:
        mutated = struct.pack("<Q", max(0, n + rng.choice([-8, -1, 1, 8, 1 << 40]))) + raw[8:]
    elif r < 0.85:
        head = mutate_bytes(raw[8:8 + n], rng)
        mutated = struct.pack("<Q", len(head)) + head + data
    else:
        mutated = raw[:rng.randrange(len(raw))] if rng.random() < 0.5 else raw + b"\0" * rng.randint(1, 64)
    weights = os.path.join(work, "w")
    os.makedirs(weights, exist_ok=True)
    shutil.copy(os.path.join(FIXTURE, "config.json"), weights)
    open(os.path.join(weights, "model.safetensors"), "wb").write(mutated)
    status, result = moert_run(tools, base["plan"], weights, work)
    if status.startswith("FAILURE"):
        return status
    parsed = parse_safetensors(mutated)
    if parsed is None:
        return "rejected" if status == "rejected" else "FAILURE silent change (a file the spec rejects was read)"
    open(os.path.join(weights, "model.safetensors"), "wb").write(canonical_safetensors(*parsed))
    canon_status, canon = moert_run(tools, base["plan"], weights, work)
    if canon_status.startswith("FAILURE"):
        return canon_status + " (the canonical rewrite)"
    if status == "rejected":
        return "rejected" if canon_status == "rejected" else \
            "FAILURE a valid file rejected that its canonical rewrite is not"
    if canon_status != "ok" or canon != result:
        return "FAILURE silent change (differs from the canonical rewrite)"
    return "same" if result == base["plain"] else "other model"


def case_json_file(tools, base, rng, work, source_dir, name, plan, weights_key):
    weights = os.path.join(work, "w")
    shutil.copytree(source_dir, weights, symlinks=False)
    path = os.path.join(weights, name)
    text = open(path, "rb").read()
    if rng.random() < 0.6:
        doc = json.loads(text)
        mutate_json(doc, rng)
        data = json.dumps(doc).encode()
    else:
        data = mutate_bytes(text, rng)
    open(path, "wb").write(data)
    status, result = moert_run(tools, plan, weights, work)
    if status != "ok":
        return status
    return "same" if result == base[weights_key] else "FAILURE silent change"


def case_index(tools, base, rng, work):
    return case_json_file(tools, base, rng, work, base["sharded_hf"],
                          "model.safetensors.index.json", base["plan"], "plain")


def case_manifest(tools, base, rng, work):
    return case_json_file(tools, base, rng, work, base["ckpt"], "manifest.json",
                          base["plan"], "plain")


STRUCTURAL_LEGIT = ("attrs", "eos_token_ids")


def case_plan(tools, base, rng, work):
    text = open(base["plan"], "rb").read()
    doc = json.loads(text)
    resealed = rng.random() < 0.5
    legit = False
    if resealed:
        steps = doc["programs"][0]["steps"]
        op = rng.randrange(4)
        if op == 0:
            del steps[rng.randrange(len(steps))]
        elif op == 1:
            i, j = rng.randrange(len(steps)), rng.randrange(len(steps))
            steps[i], steps[j] = steps[j], steps[i]
        elif op == 2:
            i = rng.randrange(len(steps))
            steps.insert(i, copy.deepcopy(steps[i]))
        else:
            path = mutate_json(doc, rng)
            legit = any(isinstance(p, str) and p in STRUCTURAL_LEGIT for p in path)
        data = seal(json.dumps(doc).encode())
    elif rng.random() < 0.6:
        mutate_json(doc, rng)
        data = json.dumps(doc, indent=2, sort_keys=True).encode()
    else:
        data = mutate_bytes(text, rng)
    plan = os.path.join(work, "mutated.plan")
    open(plan, "wb").write(data)
    status, result = moert_run(tools, plan, FIXTURE, work)
    if status != "ok":
        return status
    if not resealed and data != text:
        return "FAILURE an unsealed edit was accepted"
    if result == base["plain"]:
        return "same"
    # A resealed plan is a buggy moec's output: the structural checks must
    # catch every change but a legitimately different attribute.
    return "other model" if legit else "FAILURE a resealed structural edit was accepted with another result"


KINDS = {"config": case_config, "safetensors": case_safetensors, "index": case_index,
         "manifest": case_manifest, "plan": case_plan}


# ------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("--per-kind", type=int, default=1000)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--keep", help="a directory for the failing cases")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--asan", default=os.path.join(REPO, "build-asan"))
    ap.add_argument("--fuzz", default=os.path.join(REPO, "build-fuzz"))
    args = ap.parse_args()
    tools = argparse.Namespace(moec=os.path.join(args.build, "tools", "moec", "moec"),
                               moert=os.path.join(args.asan, "tools", "moert", "moert"),
                               fuzz_config=os.path.join(args.fuzz, "fuzz-config"))
    for t in vars(tools).values():
        if not os.access(t, os.X_OK):
            sys.exit(f"mutation-campaign: {t} is missing (scripts/setup.sh, scripts/asan.sh, "
                     "scripts/fuzz.sh build it)")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor())
    print(f"mutation-campaign: seed {args.seed}, {args.per_kind} per kind, CPU {cpu}, "
          f"moert {tools.moert} (ASan + UBSan)")

    root = tempfile.mkdtemp(prefix="moe-mutation-")
    base = {"plan": os.path.join(root, "model.plan"), "ckpt": os.path.join(root, "ckpt"),
            "sharded_hf": os.path.join(root, "hf2")}
    subprocess.run([tools.moec, "compile", os.path.join(FIXTURE, "config.json"), "-o",
                    base["plan"], "--max-seq-len", "32"], check=True)
    subprocess.run([sys.executable, os.path.join(REPO, "tests", "tools", "shard-checkpoint.py"),
                    FIXTURE, base["sharded_hf"], "2"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([tools.moert, "convert", base["plan"], "--weights", FIXTURE, "--out",
                    base["ckpt"]], check=True, env=ENV, stdout=subprocess.DEVNULL)
    for key, weights in (("plain", FIXTURE), ("hf2", base["sharded_hf"]), ("sharded", base["ckpt"])):
        status, base[key] = moert_run(tools, base["plan"], weights, root)
        if status != "ok":
            sys.exit(f"mutation-campaign: the unmutated {key} run failed: {status}")
    if not (base["plain"] == base["hf2"] == base["sharded"]):
        sys.exit("mutation-campaign: the unmutated runs differ between checkpoint formats")

    def one(kind, index):
        rng = random.Random(f"{args.seed}/{kind}/{index}")
        work = tempfile.mkdtemp(prefix=f"{kind}-{index}-", dir=root)
        try:
            outcome = KINDS[kind](tools, base, rng, work)
        except Exception as e:  # a bug of this script, not of moert
            outcome = f"FAILURE campaign error {type(e).__name__}: {e}"
        if outcome.startswith("FAILURE") and args.keep:
            keep = os.path.join(args.keep, f"{kind}-{index}")
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(work, keep)
            open(os.path.join(keep, "REPRO"), "w").write(
                f"{sys.argv[0]} --kinds {kind} --seed {args.seed} (case {index}): {outcome}\n")
        shutil.rmtree(work, ignore_errors=True)
        return kind, index, outcome

    kinds = args.kinds.split(",")
    counts = {k: {} for k in kinds}
    failures = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for kind, index, outcome in pool.map(lambda ki: one(*ki),
                                             [(k, i) for k in kinds for i in range(args.per_kind)]):
            label = "FAILURE" if outcome.startswith("FAILURE") else outcome
            counts[kind][label] = counts[kind].get(label, 0) + 1
            if label == "FAILURE":
                failures.append(f"{kind} case {index}: {outcome}")
    shutil.rmtree(root, ignore_errors=True)
    print(f"{'kind':<12} {'rejected':>9} {'same':>6} {'other model':>12} "
          f"{'FAILURES':>9}")
    for kind in kinds:
        c = counts[kind]
        print(f"{kind:<12} {c.get('rejected', 0):>9} {c.get('same', 0):>6} "
              f"{c.get('other model', 0):>12} "
              f"{c.get('FAILURE', 0):>9}")
    for f in failures:
        print("  " + f)
    print(f"mutation-campaign: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
