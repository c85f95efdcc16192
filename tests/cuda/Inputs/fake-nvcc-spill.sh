#!/bin/sh
# A stand-in nvcc whose ptxas reports a spilling kernel (errors.test).
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; shift; fi
  shift
done
: > "$out"
echo "ptxas info    : Compiling entry function 'moe_s7_attention' for 'sm_90'" >&2
echo "ptxas info    : Function properties for moe_s7_attention" >&2
echo "    24 bytes stack frame, 24 bytes spill stores, 20 bytes spill loads" >&2
exit 0
