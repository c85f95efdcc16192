#!/usr/bin/env bash
# Renders an HTML file with headless Chromium (Debian's chromium package) to
# a PNG: screenshot.sh PAGE.html OUT.png [WIDTH,HEIGHT]. A private profile
# directory; no sandbox (tests run as root in containers); fails when
# Chromium fails or writes no image.
set -euo pipefail
page=$(realpath "$1")
out=$2
size=${3:-1200,2600}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
rm -f "$out"
timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$profile" --window-size="$size" --screenshot="$out" "file://$page" \
  > "$profile/log.txt" 2>&1 || { cat "$profile/log.txt" >&2; exit 1; }
[ -s "$out" ] || { echo "screenshot.sh: chromium wrote no $out" >&2; cat "$profile/log.txt" >&2; exit 1; }
