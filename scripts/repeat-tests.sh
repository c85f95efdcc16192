#!/usr/bin/env bash
# The README's test command N times in a row, each from a fresh clone of one
# commit (issue 11: the suite must never flake; lit runs at full
# parallelism as in CI). Stops at the first failure and keeps its log.
# usage: scripts/repeat-tests.sh [N=5] [COMMIT=HEAD]
# Logs: $REPEAT_DIR (default /tmp/repeat-tests), run-<i>.log per pass.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-5}
commit=$(git -C "$repo" rev-parse "${2:-HEAD}")
dir=${REPEAT_DIR:-/tmp/repeat-tests}
mkdir -p "$dir"
# The clone sits beside a link to the checkout's ../shared (reference
# configs), as the checkout does, so the tests that read it run.
if [ -d "$repo/../shared" ] && [ ! -e "$dir/shared" ]; then
  ln -s "$(cd "$repo/../shared" && pwd)" "$dir/shared"
fi
echo "repeat-tests: $n passes of ./scripts/run-tests.sh at $commit ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
for i in $(seq 1 "$n"); do
  clone=$dir/clone
  rm -rf "$clone"
  git clone -q "$repo" "$clone"
  git -C "$clone" checkout -q "$commit"
  start=$(date +%s)
  if (cd "$clone" && CI=true ./scripts/run-tests.sh) > "$dir/run-$i.log" 2>&1; then
    echo "pass $i/$n: ok in $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s ($(grep -Eo '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$dir/run-$i.log" | tail -1))"
  else
    echo "pass $i/$n: FAILED after $(( $(date +%s) - start )) s; log: $dir/run-$i.log"
    tail -30 "$dir/run-$i.log"
    exit 1
  fi
done
rm -rf "$dir/clone"
echo "repeat-tests: $n of $n passed"
