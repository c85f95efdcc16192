"""Helpers shared by the e2e check scripts (standard library only)."""
import array
import json
import os
import struct


def read_npy(path):
    """(shape, values) of a little-endian float32 C-order .npy file."""
    with open(path, "rb") as f:
        magic = f.read(10)
        assert magic[:6] == b"\x93NUMPY", path
        length = magic[8] | (magic[9] << 8)
        header = f.read(length).decode("latin1")
        assert "'<f4'" in header and "'fortran_order': False" in header, header
        shape = tuple(int(d) for d in header.split("'shape': (")[1].split(")")[0].split(",")
                      if d.strip())
        values = array.array("f")
        values.frombytes(f.read())
    count = 1
    for d in shape:
        count *= d
    assert len(values) == count, f"{path}: {len(values)} values for shape {shape}"
    return shape, values


def fixture_prompts(fixture):
    """The reference.json of a fixture and its prompts as moert --tokens values."""
    reference = json.load(open(os.path.join(fixture, "reference.json")))
    return reference, [",".join(map(str, r["input_ids"])) for r in reference["runs"]]


def mpirun_prefix(mpirun, ranks):
    """The launcher of an N-rank job in this container (root, 2 cores)."""
    return [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]


def add_tool_arguments(parser, layouts=False, mpirun=False):
    """The arguments every check script takes: the fixture directory (and,
    for multi-rank checks, the layouts), the tools, the MPI launcher."""
    parser.add_argument("fixture")
    if layouts:
        parser.add_argument("layouts", nargs="+")
    parser.add_argument("--moec", default="moec")
    parser.add_argument("--moert", default="moert")
    if mpirun:
        parser.add_argument("--mpirun", default="mpirun")


def read_safetensors(path):
    """(header, data) of a .safetensors file: its tensor entries by name
    (`__metadata__` left in the header) and the bytes after the header
    (entry["data_offsets"] index them)."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), memoryview(raw)[8 + n:]


def write_safetensors(path, tensors, metadata=None):
    """tensors: (name, dtype, shape, bytes) in file order."""
    header, offset = ({"__metadata__": metadata} if metadata else {}), 0
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, _, blob in tensors:
            f.write(blob)


def bf16_bits(bits):
    """The bf16 of float32 bits `bits`: nearest even (a NaN stays a quiet NaN)."""
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
        return (bits | 0x400000) >> 16
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFFFFFF) >> 16
