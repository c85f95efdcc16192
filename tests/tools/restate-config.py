"""Rewrites integer, boolean and string fields of the config.json a module carries (its
`moe.config` attribute, quotes escaped as \\22): restate-config.py IN OUT
key=value ...; fails when a key is not there, so a test cannot pass by
rewriting nothing."""
import re
import sys

text = open(sys.argv[1]).read()
for pair in sys.argv[3:]:
    key, value = pair.split("=")
    if re.fullmatch(r"-?[0-9]+|true|false", value):
        pattern = re.compile(r"(\\22" + re.escape(key) + r"\\22:)(-?[0-9]+|true|false)")
        text, count = pattern.subn(lambda m: m.group(1) + value, text)
    else:  # a string
        pattern = re.compile(r"(\\22" + re.escape(key) + r"\\22:\\22)([^\\]*)(\\22)")
        text, count = pattern.subn(lambda m: m.group(1) + value + m.group(3), text)
    if count != 1:
        sys.exit(f"restate-config.py: {key} found {count} times in {sys.argv[1]}")
open(sys.argv[2], "w").write(text)
