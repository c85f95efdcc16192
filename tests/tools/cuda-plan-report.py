#!/usr/bin/env python3
"""cuda-plan-report.py PLAN: for each program of a plan compiled with
`moec compile --target cuda`, prints its source name, fatbin size and archs,
the fatbin's entries (fatbin-list.py: `ELF sm_80`, `PTX compute_80`, ...),
and the number of (kernel, arch) pairs ptxas reported with neither stack
frame nor spills. The plan carries all of it (docs/cuda.md). Exit 1 when a
fatbin or ptxas report is missing, or ptxas reported a stack frame or spills
for any kernel.

cuda-plan-report.py --ptxas N PLAN: prints program N's ptxas report.
cuda-plan-report.py --fatbin N OUT PLAN: writes program N's fatbin to OUT."""
import base64
import json
import os
import re
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
if args and args[0] == "--ptxas":
    plan = json.load(open(args[2]))
    sys.stdout.write(plan["programs"][int(args[1])]["cuda"]["ptxas_report"])
    sys.exit(0)
if args and args[0] == "--fatbin":
    plan = json.load(open(args[3]))
    open(args[2], "wb").write(base64.b64decode(plan["programs"][int(args[1])]["cuda"]["fatbin"]))
    sys.exit(0)
plan_path = args[0]
plan = json.load(open(plan_path))
for index, program in enumerate(plan["programs"]):
    cuda = program["cuda"]
    if "fatbin" not in cuda or "ptxas_report" not in cuda:
        sys.exit("program %d: no fatbin or ptxas report in the plan" % index)
    image = base64.b64decode(cuda["fatbin"])
    print("program %d source %s code %s fatbin %s archs %s kernels %d"
          % (index, cuda["source"], "yes" if cuda.get("code") else "no",
             "yes" if image else "no", ",".join(cuda["archs"]), cuda["kernels"]))
    with tempfile.NamedTemporaryFile(suffix=".fatbin") as f:
        f.write(image)
        f.flush()
        listing = subprocess.run([sys.executable, os.path.join(here, "fatbin-list.py"), f.name],
                                 capture_output=True, text=True, check=True).stdout
    sys.stdout.write(listing)
    report = cuda["ptxas_report"]
    clean = report.count("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    bad = re.findall(r"[1-9][0-9]* bytes (?:stack frame|spill)", report)
    if bad:
        sys.exit("program %d: ptxas reports local memory: %s" % (index, bad[0]))
    print("no spills: %d kernel(s) x %d arch(s)" % (clean // len(cuda["archs"]), len(cuda["archs"])))
