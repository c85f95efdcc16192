#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: ctest runs the lit suite
# (IR, diagnostics, tools, end to end) and the GoogleTest units. Tests that
# need a GPU carry the ctest label `gpu` and are skipped without one.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "$(nproc)" --timeout 1200
