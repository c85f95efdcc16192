#!/bin/sh
# A stand-in nvcc for the tests that run plans on the fake CUDA driver
# (%fake-cuda-env): that driver builds the kernels' source for the host and
# never reads the fatbin, so these tests need not pay for nvcc. It writes a
# fatbin header without entries (magic 0xBA55ED50) and an empty ptxas report.
# The real nvcc's output is checked by fatbin-fixtures.test and
# fatbin-large.test.
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; shift; fi
  shift
done
printf '\120\355\125\272\001\000\020\000\000\000\000\000\000\000\000\000' > "$out"
exit 0
