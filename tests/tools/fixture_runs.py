"""Helpers shared by the e2e check scripts (standard library only)."""
import array
import json
import os


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
