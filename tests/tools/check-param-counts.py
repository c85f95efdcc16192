#!/usr/bin/env python3
"""check-param-counts.py MOEC CONFIGS_DIR REFERENCE_JSON PUBLISHED_README

For every config folder, runs `moec inspect --json` and checks
- `params.total` and `params.active` equal the exact counts that
  `transformers` reports for the same config (REFERENCE_JSON, written by
  tests/fixtures/generate.py param-counts); active includes the embedding;
- `params.total` agrees with the published total in PUBLISHED_README
  (shared/configs/README.md) to its printed precision (e.g. "46.7B").
Prints one line per model and exits 1 on any mismatch.
"""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

moec, configs, reference_path, readme = sys.argv[1:5]
reference = json.loads(Path(reference_path).read_text())["models"]

# | model (folder) | model_type | total | active | notes |
published = {}
for line in Path(readme).read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 3 or not re.fullmatch(r"~?[\d.]+B( / [\d.]+B)?", cells[2]):
        continue
    folders = cells[0].replace("(-Chat)", "").split(" / ")
    totals = cells[2].split(" / ")
    if len(totals) == 1 and "(-Chat)" in cells[0]:
        folders = [cells[0].replace("(-Chat)", ""), cells[0].replace("(-Chat)", "-Chat")]
        totals = totals * 2
    for folder, total in zip(folders, totals):
        published[folder.strip()] = total.lstrip("~")


def agrees(exact, printed):
    """True if `exact` rounds to `printed` (e.g. "46.7B") at its precision."""
    value = float(printed.rstrip("B"))
    decimals = len(printed.rstrip("B").partition(".")[2])
    return round(exact / 1e9, decimals) == value


failures = 0
checked = 0
for folder in sorted(p.name for p in Path(configs).iterdir() if (p / "config.json").is_file()):
    out = subprocess.run([moec, "inspect", "--json", str(Path(configs) / folder / "config.json")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        print(f"FAIL {folder}: moec exited {out.returncode}: {out.stderr.strip()}")
        failures += 1
        continue
    summary = json.loads(out.stdout)
    params = summary["params"]
    ref = reference.get(folder, {})
    # DeepSeek-V3's e_score_correction_bias is a buffer in transformers (not
    # in model.parameters()) but a tensor of the checkpoint, which we count.
    buffers = 0
    if summary["model_type"] == "deepseek_v3":
        buffers = summary["num_moe_layers"] * summary["num_experts"]
    problems = []
    for key in ("total", "active"):
        if ref.get(key) is None:
            problems.append(f"no transformers reference for {key}")
        elif params[key] != ref[key] + buffers:
            problems.append(f"{key} {params[key]} != transformers {ref[key]} + {buffers} buffer values")
    # Llama-3.1-70B's "70B" is a name: its exact count is 70.55B (checked
    # against transformers above); every other row is a rounded count.
    name = published.get(folder)
    if name is None:
        problems.append("no published total")
    elif folder != "Llama-3.1-70B" and not agrees(params["total"], name):
        problems.append(f"total {params['total']} does not round to published {name}")
    checked += 1
    if problems:
        failures += 1
        print(f"FAIL {folder}: " + "; ".join(problems))
    else:
        print(f"ok   {folder}: total {params['total']:,} (published {name}), active {params['active']:,}")

print(f"{checked - failures} passed, {failures} failed")
sys.exit(1 if failures or checked == 0 else 0)
