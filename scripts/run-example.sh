#!/usr/bin/env bash
# Sets up, builds, and runs the main job on the bundled tiny Mixtral:
# summary and parameter counts, then the model's moe-dialect IR.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
model=tests/fixtures/models/mixtral
bin=${BUILD_DIR:-build}/tools
"$bin/moec/moec" inspect "$model/config.json"
"$bin/moec/moec" import "$model/config.json" -o "${BUILD_DIR:-build}/mixtral.mlir"
echo "IR written to ${BUILD_DIR:-build}/mixtral.mlir; first layer:"
sed -n '3,30p' "${BUILD_DIR:-build}/mixtral.mlir"
