#!/usr/bin/env python3
"""dequantise-fp8.py FP8_DIR OUT_DIR --dtype bf16|f32 [--keep-fp8] [--every-byte NAME]

The model of an FP8 block-scaled checkpoint (config.json with
quantization_config, model.safetensors with F8_E4M3 weights and their F32
`<name>_scale_inv`) written as a plain checkpoint of the same model: each
FP8 weight W[r, c] = e4m3(q[r, c]) * scale_inv[r / br, c / bc], computed as
float32 (round to nearest even) and, with --dtype bf16, rounded again to
bf16 (nearest even): the values moert's FP8 GEMMs multiply (CUDA:
moe_dequant_fp8; CPU: src/cpu/GemmFp8.cpp's bf16 tables). Every other
tensor is copied as stored (with --dtype bf16, F32 ones are rounded to
bf16: DeepSeek-V3's F32 e_score_correction_bias, which a plain BF16 model
would read as BF16); the scales are dropped, and so is quantization_config.
--keep-fp8 leaves the FP8 weights, their scales and quantization_config as
they are, and stores the other F32 tensors' bf16 values as F32 (an FP8
DeepSeek-V3 reads its bias as F32): the FP8 model that equals the plain one
written without it. --every-byte NAME first overwrites FP8 weight NAME
with the 254 finite e4m3 bytes in turn (subnormals, zeros of both signs,
the largest magnitudes): with --keep-fp8, a checkpoint whose GEMMs meet
every value. Standard library only.
"""
import argparse
import json
import os
import shutil
import struct
import sys

from fixture_runs import bf16_bits, read_safetensors, write_safetensors


def e4m3(b):
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        v = float("nan")
    elif e == 0:
        v = m / 8 * 2.0 ** -6
    else:
        v = (1 + m / 8) * 2.0 ** (e - 7)
    return -v if b & 128 else v


def f32_bits(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fp8_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--dtype", choices=["bf16", "f32"], required=True)
    ap.add_argument("--keep-fp8", action="store_true")
    ap.add_argument("--every-byte")
    args = ap.parse_args()
    config = json.load(open(os.path.join(args.fp8_dir, "config.json")))
    quant = config.get("quantization_config") if args.keep_fp8 else config.pop(
        "quantization_config", None)
    if not quant:
        sys.exit(f"{args.fp8_dir}/config.json: no quantization_config")
    br, bc = quant["weight_block_size"]
    path = os.path.join(args.fp8_dir, "model.safetensors")
    header, raw = read_safetensors(path)
    meta = header.pop("__metadata__", None)

    def data(name):
        begin, end = header[name]["data_offsets"]
        if name == args.every_byte:
            finite = [b for b in range(256) if b & 127 != 127]
            return bytes(finite[i % len(finite)] for i in range(end - begin))
        return bytes(raw[begin:end])

    if args.every_byte and header.get(args.every_byte, {}).get("dtype") != "F8_E4M3":
        sys.exit(f"{path}: '{args.every_byte}' is no F8_E4M3 tensor")

    tensors = {}
    for name, entry in header.items():
        fp8_part = name.endswith("_scale_inv") or entry["dtype"] == "F8_E4M3"
        if fp8_part and args.keep_fp8:
            tensors[name] = (entry["dtype"], entry["shape"], data(name))
            continue
        if name.endswith("_scale_inv"):
            continue
        if entry["dtype"] == "F32" and args.dtype == "bf16":
            blob = data(name)
            halves = [bf16_bits(w) for w in struct.unpack(f"<{len(blob) // 4}I", blob)]
            tensors[name] = (("F32", entry["shape"],
                              struct.pack(f"<{len(halves)}I", *[h << 16 for h in halves]))
                             if args.keep_fp8 else
                             ("BF16", entry["shape"], struct.pack(f"<{len(halves)}H", *halves)))
            continue
        if entry["dtype"] != "F8_E4M3":
            tensors[name] = (entry["dtype"], entry["shape"], data(name))
            continue
        rows, cols = entry["shape"]
        scale_entry = header.get(name + "_scale_inv")
        if not scale_entry or scale_entry["dtype"] != "F32":
            sys.exit(f"{path}: FP8 weight '{name}' has no F32 '{name}_scale_inv'")
        stride = scale_entry["shape"][1]
        scales = struct.unpack(f"<{len(data(name + '_scale_inv')) // 4}f",
                               data(name + "_scale_inv"))
        q = data(name)
        bits = [f32_bits(e4m3(q[r * cols + c]) * scales[(r // br) * stride + c // bc])
                for r in range(rows) for c in range(cols)]
        if args.dtype == "bf16":
            out = struct.pack(f"<{len(bits)}H", *[bf16_bits(b) for b in bits])
            tensors[name] = ("BF16", entry["shape"], out)
        else:
            tensors[name] = ("F32", entry["shape"], struct.pack(f"<{len(bits)}I", *bits))

    os.makedirs(args.out_dir, exist_ok=True)
    write_safetensors(os.path.join(args.out_dir, "model.safetensors"),
                      [(name, *t) for name, t in tensors.items()], meta)
    json.dump(config, open(os.path.join(args.out_dir, "config.json"), "w"), indent=2)
    for extra in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(args.fp8_dir, extra)):
            shutil.copy(os.path.join(args.fp8_dir, extra), args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
