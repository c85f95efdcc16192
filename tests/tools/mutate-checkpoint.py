#!/usr/bin/env python3
"""mutate-checkpoint.py SRC_DIR DST_DIR ACTION [NAME]: copies a fixture's
config.json and model.safetensors with one defect, for bad-input tests.

ACTION: drop NAME       remove tensor NAME
        extra NAME      add a tensor NAME (4 floats) that no model has
        reshape NAME    swap the two dims of tensor NAME (same bytes)
        truncate        cut the file in the middle of its data
        bad-header      replace the JSON header with garbage of the same size
        nan NAME        set the first element of F32 tensor NAME to NaN
        retype NAME     relabel F8_E4M3 tensor NAME as U8 (same bytes)
Standard library only.
"""
import json
import os
import shutil
import struct
import sys

src, dst, action = sys.argv[1:4]
name = sys.argv[4] if len(sys.argv) > 4 else None
os.makedirs(dst, exist_ok=True)
shutil.copy(os.path.join(src, "config.json"), dst)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]

if action == "drop":
    # Its bytes go too (the format has no gaps): a well-formed file that
    # lacks the tensor.
    b, e = header.pop(name)["data_offsets"]
    data = data[:b] + data[e:]
    for entry in header.values():
        if isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= e:
            entry["data_offsets"] = [o - (e - b) for o in entry["data_offsets"]]
elif action == "extra":
    header[name] = {"dtype": "F32", "shape": [4], "data_offsets": [len(data), len(data) + 16]}
    data += b"\0" * 16
elif action == "reshape":
    header[name]["shape"] = header[name]["shape"][::-1]
elif action == "nan":
    b = header[name]["data_offsets"][0]
    data = data[:b] + struct.pack("<f", float("nan")) + data[b + 4:]
elif action == "retype":
    header[name]["dtype"] = "U8"
elif action == "truncate":
    data = data[: len(data) // 2]
elif action == "bad-header":
    text = b"{" + b"x" * (n - 1)
    open(os.path.join(dst, "model.safetensors"), "wb").write(raw[:8] + text + data)
    sys.exit(0)
else:
    sys.exit(f"unknown action {action}")

text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(os.path.join(dst, "model.safetensors"), "wb").write(struct.pack("<Q", len(text)) + text + data)
