#!/bin/sh
# full-disk.sh SIZE DIR COMMAND...: runs COMMAND (a shell command line) in a
# mount namespace of its own where DIR is a fresh tmpfs of SIZE (e.g. 64k):
# a disk that fills up, seen by nothing else. Prints COMMAND's output, then
# what DIR holds, and exits with COMMAND's status.
size=$1 dir=$2
shift 2
exec unshare -m sh -c '
  mount -t tmpfs -o size="$1" tmpfs "$2" || exit 99
  dir=$2
  shift 2
  sh -c "$*" 2>&1
  status=$?
  echo "status $status"
  ls -A "$dir" | sed "s/^/left: /"
  exit 0
' full-disk "$size" "$dir" "$@"
