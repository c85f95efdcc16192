#!/usr/bin/env bash
# moert and its unit tests built with AddressSanitizer + UndefinedBehavior-
# Sanitizer into build-asan/ (the compiler is not: MLIR's libraries are not
# instrumented, and moec only writes the plans), then run: the GoogleTest
# units, every fixture end to end against the transformers references, and
# the conformance fixtures saved by transformers 5.x, single rank; then the
# end-to-end tests that run several ranks under mpirun and write, convert,
# reshard, export and damage checkpoints, with this moert ahead of build/'s
# on PATH (tests/lit.cfg.py: MOE_MOERT_DIR). Any sanitizer report fails.
# Needs build/ (scripts/setup.sh) for moec and the lit suite.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${ASAN_DIR:-build-asan}
build=${BUILD_DIR:-build}
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ ! -f "$out/build.ninja" ]; then
  mkdir -p "$out"
  cmake -G Ninja -S . -B "$out" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DMLIR_DIR="$(llvm-config-19 --cmakedir)/../mlir" \
    -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san" \
    > "$out/configure.log" 2>&1 || { cat "$out/configure.log"; exit 1; }
fi
cmake --build "$out" --target moert moert-unit-tests -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1
moert="$out/tools/moert/moert" moec="$build/tools/moec/moec"
"$out/tests/runtime/moert-unit-tests" --gtest_brief=1
status=0
for fixture in tests/fixtures/models/*/; do
  extra=()
  precision=
  # BF16 weights: against the formula the kernels in use compute (bf16
  # inputs where the CPU has the bf16 dot instruction, docs/cpu-kernels.md).
  # A BF16 fixture whose reference is the fp32 forward of its values alone
  # (deepseek_v3-fp8-bf16) runs with f32 products.
  if [[ -e "$fixture/prompt0_logits_bf16inputs.npy" ]]; then
    if "$moert" --version | grep -q "times bf16 inputs"; then
      extra=(--reference bf16inputs)
    else
      extra=(--reference f32compute)
    fi
  elif [[ "$fixture" == *bf16* ]]; then
    precision=f32
  fi
  env ${precision:+MOERT_MATMUL_PRECISION=$precision} \
    python3 tests/tools/check-fixture.py --moec "$moec" --moert "$moert" "${extra[@]}" "$fixture" \
    | tail -1 | sed "s|^|asan: $(basename "$fixture"): |" || status=1
done
for family in mixtral qwen2_moe qwen3_moe olmoe deepseek_v2 deepseek_v3 llama; do
  python3 tests/tools/check-conformance.py --moec "$moec" --moert "$moert" \
    --refusals tests/fixtures/conformance/refusals.json tests/fixtures/conformance/v5 "$family" \
    | tail -1 | sed "s|^|asan: conformance v5 $family: |" || status=1
done
# Open MPI's allocations that live until the process ends are its own, not
# moert's (scripts/lsan-openmpi.supp). Not here: checkpoint-memory.test
# (it bounds RSS, which ASan's shadow memory inflates) and full-disk.test.
lit=$(sed -n 's/^MOE_LIT:FILEPATH=//p' "$build/CMakeCache.txt")
e2e=()
for t in partitioned-capacity partitioned-deepseek_v3 partitioned-faults partitioned-mixtral \
         partitioned-more partitioned-qwen2_moe checkpoint-bad checkpoint-convert \
         checkpoint-export checkpoint-fused checkpoint-kill checkpoint-reshard checkpoint-tp8 \
         sharded-checkpoint bad-input sampling; do
  e2e+=("$build/tests/e2e/$t.test")
done
# Components stay loaded (their frames named) and stacks are unwound
# through Open MPI's frame-pointer-less code, so the suppressions match.
MOE_MOERT_DIR="$out/tools/moert" OMPI_MCA_mca_base_component_disable_dlclose=1 \
  ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" \
  LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-openmpi.supp:print_suppressions=0" \
  python3 "$lit" -s -j "$(nproc)" "${e2e[@]}" | sed "s|^|asan: |" || status=1
exit $status
