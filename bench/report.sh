#!/usr/bin/env bash
# How long the plan report of DeepSeek-V3 on 2,048 H100 takes (issue 21:
# under 5 s): moec report on the plan, then headless Chromium's start,
# layout, paint and screenshot of the page. Usage: bench/report.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/tools/moec/moec" compile ../shared/configs/DeepSeek-V3/config.json --world-size 2048 \
  --gpu h100 -o "$tmp/ds2048.plan"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
echo "plan: $(stat -c %s "$tmp/ds2048.plan") bytes"
for round in 1 2 3; do
  start=$(date +%s.%N)
  "$build/tools/moec/moec" report "$tmp/ds2048.plan" -o "$tmp/ds2048.html"
  mid=$(date +%s.%N)
  tests/tools/screenshot.sh "$tmp/ds2048.html" "$tmp/ds2048.png"
  end=$(date +%s.%N)
  echo "round $round: moec report $(echo "$mid - $start" | bc) s, chromium render $(echo "$end - $mid" | bc) s ($(stat -c %s "$tmp/ds2048.html") bytes of HTML)"
done
