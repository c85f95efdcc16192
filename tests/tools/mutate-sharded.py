#!/usr/bin/env python3
"""mutate-sharded.py SRC_CKPT DST_CKPT ACTION [ARG]: copies a sharded
checkpoint (moert convert) with one defect, for bad-input tests.

FILE may be a rank's prefix ("rank-00001"): rank files carry a generation
tag (rank-00001-<tag>.safetensors), found here by the prefix.

ACTION: truncate FILE        cut FILE in the middle of its data
        flip FILE            flip one bit near the end of FILE (same size)
        drop-file FILE       remove FILE
        manifest OTHER_CKPT  replace manifest.json with OTHER_CKPT's
        drop-box TENSOR      remove the last box of TENSOR from manifest.json
Standard library only.
"""
import json
import os
import shutil
import sys

src, dst, action, arg = sys.argv[1:5]
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
path = os.path.join(dst, arg)
if action in ("truncate", "flip", "drop-file") and not os.path.exists(path):
    matches = sorted(f for f in os.listdir(dst) if f.startswith(arg + "-") and f.endswith(".safetensors"))
    if len(matches) != 1:
        sys.exit(f"{arg}: expected one matching file in {dst}, found {matches}")
    path = os.path.join(dst, matches[0])
if action == "truncate":
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[: len(raw) // 2])
elif action == "flip":
    raw = bytearray(open(path, "rb").read())
    raw[-3] ^= 0x10
    open(path, "wb").write(bytes(raw))
elif action == "drop-file":
    os.remove(path)
elif action == "manifest":
    shutil.copy(os.path.join(arg, "manifest.json"), os.path.join(dst, "manifest.json"))
elif action == "drop-box":
    manifest_path = os.path.join(dst, "manifest.json")
    manifest = json.load(open(manifest_path))
    tensor = [t for t in manifest["tensors"] if t["name"] == arg][0]
    tensor["boxes"].pop()
    json.dump(manifest, open(manifest_path, "w"), indent=1)
else:
    sys.exit(f"unknown action {action}")
