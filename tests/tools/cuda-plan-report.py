#!/usr/bin/env python3
"""cuda-plan-report.py PLAN: for each program of a plan compiled with
`moec compile --target cuda`, prints its source, fatbin and archs, the
fatbin's entries (fatbin-list.py: `ELF sm_80`, `PTX compute_80`, ...), and
the number of (kernel, arch) pairs ptxas reported with neither stack frame
nor spills. Exit 1 when a fatbin or ptxas report is missing, or ptxas
reported a stack frame or spills for any kernel."""
import json
import os
import re
import subprocess
import sys

plan_path = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
plan = json.load(open(plan_path))
base = os.path.dirname(plan_path)
for index, program in enumerate(plan["programs"]):
    cuda = program["cuda"]
    print("program %d source %s fatbin %s archs %s kernels %d"
          % (index, cuda["source"], cuda["fatbin"], ",".join(cuda["archs"]), cuda["kernels"]))
    listing = subprocess.run([sys.executable, os.path.join(here, "fatbin-list.py"),
                              os.path.join(base, cuda["fatbin"])],
                             capture_output=True, text=True, check=True).stdout
    sys.stdout.write(listing)
    report = open(os.path.join(base, cuda["ptxas_report"])).read()
    clean = report.count("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")
    bad = re.findall(r"[1-9][0-9]* bytes (?:stack frame|spill)", report)
    if bad:
        sys.exit("program %d: ptxas reports local memory: %s" % (index, bad[0]))
    print("no spills: %d kernel(s) x %d arch(s)" % (clean // len(cuda["archs"]), len(cuda["archs"])))
