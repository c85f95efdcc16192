#!/bin/sh
# check-no-mlir.sh DIR: fails when a source file in DIR includes an MLIR or
# LLVM header or the CMake there links an MLIR/LLVM library.
dir=$1
if grep -rnE '#[[:space:]]*include[[:space:]]*[<"](mlir|llvm|llvm-c)/' "$dir"; then
  echo "error: the runtime includes MLIR/LLVM headers (above)" >&2
  exit 1
fi
if grep -rnE '\b(MLIR[A-Za-z]*|LLVM[A-Z][A-Za-z]*)\b' "$dir" --include=CMakeLists.txt | grep -v '^\s*#' | grep -vE ':[0-9]+:#'; then
  echo "error: the runtime's CMake mentions MLIR/LLVM libraries (above)" >&2
  exit 1
fi
echo "runtime/ is free of MLIR and LLVM"
