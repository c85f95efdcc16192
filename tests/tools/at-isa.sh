#!/bin/sh
# at-isa.sh LEVEL MOERT COMMAND...: runs COMMAND with MOERT_ISA=LEVEL (the CPU
# kernels of that instruction-set level), or exits 77 (ctest: skipped) when
# this CPU does not run LEVEL, as `MOERT --version` says.
level=$1 moert=$2
shift 2
if ! "$moert" --version | grep -Eq "this CPU runs (.*, )?$level(,|\))"; then
  echo "skipped: this CPU does not run $level ($("$moert" --version | tail -1))"
  exit 77
fi
MOERT_ISA=$level exec "$@"
