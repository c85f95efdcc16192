"""The integrity seal of plan files (schema/include/moe/PlanSchema.h), for
tests that build or edit plans as a buggy compiler would: the structural
checks behind the seal still have to hold. Standard library only."""
import re

_SEAL = re.compile(rb'\s*,\s*"integrity"\s*:\s*"fnv1a64:[0-9a-f]{16}"(?=\s*\}\s*$)')


def fnv1a64(data: bytes) -> int:
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def seal(text: bytes) -> bytes:
    """`text` (a JSON object) without any old seal, sealed anew."""
    text = _SEAL.sub(b"", text)
    brace = text.rindex(b"}")
    return text[:brace] + b',"integrity":"fnv1a64:%016x"' % fnv1a64(text) + text[brace:]
