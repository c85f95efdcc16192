#!/bin/sh
# check-no-model-ops.sh RUNTIME_DIR: fails when the runtime dispatches on a
# model-level op outside the op definitions (RUNTIME_DIR/src/ops, one OpDef
# per op, moert/Op.h). The plan reader, the devices, the communicators and
# the executor reach an op only through its definition (its checks, CPU
# kernel, collective kind and traits): no op enum, no switch over ops, no
# comparison of an op's name, no table keyed by op names, no reference to
# one op's definition.
dir=$1
names=$(sed -n 's/^const OpDef k[A-Za-z]* = {"\([a-z_]*\)".*/\1/p' "$dir"/src/ops/*.cpp)
count=$(echo "$names" | grep -c .)
if [ "$count" -lt 20 ]; then
  echo "error: found only $count op definitions in $dir/src/ops (expected every op's" \
       "'const OpDef kName = {\"name\", ...}')" >&2
  exit 1
fi
outside() {
  grep -rnE --include='*.cpp' --include='*.h' "$1" "$dir/src" "$dir/include" |
    grep -v "^$dir/src/ops/"
}
status=0
if outside '\bOpKind\b|\bopName\(|switch \([^)]*\bop\)|\bop->name *[!=]=|[!=]= *[A-Za-z_.>-]*op->name|findOp\("|ops::k[A-Z]'; then
  echo "error: the runtime dispatches on an op outside src/ops (above)" >&2
  status=1
fi
for name in $names; do
  # A table or a list keyed by op names: {"rms_norm", ...} or "rms_norm", "add".
  if outside "\{ *\"$name\" *,|^[^/]*\"$name\" *, *\"[a-z_]+\""; then
    echo "error: the runtime keys a table by op names (op '$name', above)" >&2
    status=1
  fi
done
[ $status -eq 0 ] && echo "runtime/ reaches its $count ops only through src/ops"
exit $status
