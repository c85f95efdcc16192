#!/usr/bin/env python3
"""Lists the entries of a CUDA fatbin (what `cuobjdump --list-elf --list-ptx`
shows), without the CUDA toolkit: one line per entry, `ELF sm_80` or
`PTX compute_80`, in file order. Exit 1 when the file is not a fatbin or an
ELF entry does not start with the ELF magic.

Format (nvcc --fatbin): a 16-byte header (u32 magic 0xBA55ED50, u16 version,
u16 header size, u64 size of the entries), then entries, each a header (u16
kind: 1 PTX, 2 ELF; u16; u32 header size; u64 payload size; ...; u32 arch
at byte 28) followed by its payload."""
import struct
import sys


def main():
    data = open(sys.argv[1], "rb").read()
    if len(data) < 16:
        sys.exit("fatbin-list: %s: too short" % sys.argv[1])
    magic, _, header, size = struct.unpack_from("<IHHQ", data, 0)
    if magic != 0xBA55ED50:
        sys.exit("fatbin-list: %s: not a fatbin (magic %#x)" % (sys.argv[1], magic))
    at, end = header, header + size
    while at < end:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, at)
        arch = struct.unpack_from("<I", data, at + 28)[0]
        body = data[at + entry_header: at + entry_header + 4]
        if kind == 2:
            if body != b"\x7fELF":
                sys.exit("fatbin-list: ELF entry for sm_%d without the ELF magic" % arch)
            print("ELF sm_%d" % arch)
        elif kind == 1:
            print("PTX compute_%d" % arch)
        else:
            print("kind %d arch %d" % (kind, arch))
        at += entry_header + payload


if __name__ == "__main__":
    main()
