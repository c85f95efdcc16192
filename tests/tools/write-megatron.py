#!/usr/bin/env python3
"""write-megatron.py TOKENS.npy PREFIX [--dtype-code N] [--sequences K] [--corrupt WHAT]

Writes the int32 ids of TOKENS.npy (1-D, as `moert tokenize` and the
training fixtures store them) as a Megatron indexed dataset PREFIX.bin +
PREFIX.idx (MMIDIDX version 1; dtype code 8 = uint16 by default, 4 = int32),
split into K sequences of near-equal length, one document each. --corrupt
writes a broken one for the error tests: magic, version, dtype (float32),
pointer (a sequence past the end of .bin), trailing (bytes after the index).
Python standard library only."""
import argparse
import struct

ITEM = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 7: "f", 8: "H"}


def read_ids(path):
    data = open(path, "rb").read()
    header_len = struct.unpack("<H", data[8:10])[0]
    assert b"'<i4'" in data[10:10 + header_len], "expected int32 ids"
    body = data[10 + header_len:]
    return list(struct.unpack(f"<{len(body) // 4}i", body))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tokens")
    p.add_argument("prefix")
    p.add_argument("--dtype-code", type=int, default=8)
    p.add_argument("--sequences", type=int, default=3)
    p.add_argument("--corrupt", choices=["magic", "version", "dtype", "pointer", "trailing"])
    a = p.parse_args()
    ids = read_ids(a.tokens)
    code = 7 if a.corrupt == "dtype" else a.dtype_code
    item = ITEM[code]
    size = struct.calcsize(item)
    cuts = [len(ids) * i // a.sequences for i in range(a.sequences + 1)]
    lengths = [cuts[i + 1] - cuts[i] for i in range(a.sequences)]
    pointers = [cuts[i] * size for i in range(a.sequences)]
    if a.corrupt == "pointer":
        pointers[-1] += 4096
    with open(a.prefix + ".bin", "wb") as f:
        f.write(struct.pack(f"<{len(ids)}{item}", *ids))
    with open(a.prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" if a.corrupt != "magic" else b"NOTANIDX\x00")
        f.write(struct.pack("<Q", 2 if a.corrupt == "version" else 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", a.sequences))
        f.write(struct.pack("<Q", a.sequences + 1))
        f.write(struct.pack(f"<{a.sequences}i", *lengths))
        f.write(struct.pack(f"<{a.sequences}q", *pointers))
        f.write(struct.pack(f"<{a.sequences + 1}q", *range(a.sequences + 1)))
        if a.corrupt == "trailing":
            f.write(b"\x00" * 5)


if __name__ == "__main__":
    main()
