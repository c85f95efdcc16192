#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: ctest runs the lit suite
# (IR, diagnostics, tools, end to end) and the GoogleTest units, after the
# fuzzers have run for FUZZ_SECONDS (default 30) each and the runtime's
# sanitizer build has passed its units and end-to-end fixtures and the
# mutation campaign. Tests that
# need a GPU carry the ctest label `gpu` and are skipped without one.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys without this checkout's path (the sanitizer and fuzz builds
# carry debug info, whose paths would otherwise make a fresh clone miss
# every object another checkout of the same sources compiled).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
# Each stage's wall time, printed when it ends (where CI's minutes go).
stage() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  echo "run-tests: $name took $((SECONDS - start)) s"
}
stage setup ./scripts/setup.sh
# Every input reader under libFuzzer + ASan + UBSan for a bounded time
# (a longer run: scripts/fuzz.sh 3600).
stage fuzz ./scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
# moert and its units under ASan + UBSan: the unit tests, every fixture and
# the transformers 5.x conformance fixtures end to end.
stage asan ./scripts/asan.sh
# Mutated configs, safetensors files, indexes, manifests and plans against
# the sanitized moert: no crash, hang or silent change (issue 11's count is
# 1000 per kind: tests/tools/mutation-campaign.py, ~3 min).
stage mutations python3 tests/tools/mutation-campaign.py --per-kind "${MUTATIONS_PER_KIND:-200}"
stage ctest ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 1800
