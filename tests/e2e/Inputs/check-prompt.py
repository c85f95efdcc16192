#!/usr/bin/env python3
"""moert run --prompt end to end on a fixture model (stdlib only).

For every prompt of TOKENIZER_DIR/tokenizer_expected.json (ids from the
tokenizers library): `moert tokenize` gives those ids; `moert run --prompt
TEXT --print-ids` generates what `moert run --tokens IDS` generates; `moert
run --prompt TEXT` prints the text `moert detokenize --skip-special` gives
for those ids, and the same when its stdout is a terminal (streamed); a
batch of all prompts gives each prompt's lines in order; token data written
by `moert tokenize --input` holds the same ids.
Usage: check-prompt.py MOERT PLAN WEIGHTS_DIR TOKENIZER_DIR TMP_DIR
"""
import json
import os
import pty
import struct
import subprocess
import sys

moert, plan, weights, model, tmp = sys.argv[1:6]
gen = ["--max-new-tokens", "10", "--ignore-eos"]
if weights != model:
    gen += ["--tokenizer", model]


def run(*args):
    out = subprocess.run([moert, *args], check=True, capture_output=True, text=True)
    return out.stdout


def run_on_terminal(*args):
    """stdout a pseudo-terminal: the continuation is streamed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([moert, *args], stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait() == 0, proc.stderr.read()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def npy(path):
    with open(path, "rb") as f:
        data = f.read()
    length = struct.unpack("<H", data[8:10])[0]
    header = data[10:10 + length].decode()
    fmt = "i" if "'<i4'" in header else "q"
    body = data[10 + length:]
    return list(struct.unpack("<%d%s" % (len(body) // struct.calcsize(fmt), fmt), body))


prompts = json.load(open(os.path.join(model, "tokenizer_expected.json")))["prompts"]
texts, batch = [], []
for p in prompts:
    ids = ",".join(map(str, p["ids"]))
    got = run("tokenize", "--tokenizer", model, p["text"]).strip()
    assert got == ids, (p["text"], got, ids)
    by_text = run("run", plan, "--weights", weights, "--prompt", p["text"], "--print-ids", *gen)
    by_ids = run("run", plan, "--weights", weights, "--tokens", ids, *gen)
    assert by_text == by_ids, (by_text, by_ids)
    text = run("run", plan, "--weights", weights, "--prompt", p["text"], *gen)
    expected = run("detokenize", "--tokenizer", model, "--skip-special", by_ids.strip())
    assert text == expected, (text, expected)
    streamed = run_on_terminal("run", plan, "--weights", weights, "--prompt", p["text"], *gen)
    assert streamed == text, (streamed, text)
    assert text.strip(), "no text"
    texts.append(text)
    batch += ["--prompt", p["text"]]
    print("PROMPT", repr(p["text"]), "->", repr(text.rstrip("\n")))
both = run("run", plan, "--weights", weights, *batch, *gen)
assert both == "".join(texts), (both, texts)

# Token data: one document per JSONL line, EOS (</s> = 2) after each.
with open(os.path.join(tmp, "docs.jsonl"), "w") as f:
    for p in prompts:
        f.write(json.dumps({"text": p["text"]}) + "\n")
subprocess.run([moert, "tokenize", "--tokenizer", model, "--input", os.path.join(tmp, "docs.jsonl"),
                "--output", os.path.join(tmp, "data"), "--threads", "2"], check=True)
tokens = npy(os.path.join(tmp, "data.tokens.npy"))
offsets = npy(os.path.join(tmp, "data.docs.npy"))
expected_tokens = [t for p in prompts for t in p["ids"] + [2]]
assert tokens == expected_tokens, (tokens, expected_tokens)
assert offsets[0] == 0 and offsets[-1] == len(tokens) and len(offsets) == len(prompts) + 1, offsets
print("OK", len(prompts), "prompts")
