#!/usr/bin/env bash
# Fuzzes every input reader for SECONDS each (default 60): config.json
# (moec's frontend), safetensors files, index.json, sharded manifests, plans
# and tokenizer.json (moert). libFuzzer + AddressSanitizer + UndefinedBehaviorSanitizer,
# built with clang into build-fuzz/ (tests/fuzz/fuzz_inputs.cpp says what
# each target does). Seed corpora come from the fixtures and from plans and
# a manifest made with build/ (run scripts/setup.sh first). A finding
# (crash, sanitizer report, internal error, > 20 s for one input, > 2 GB) is
# saved as build-fuzz/TARGET/crash-* and the script exits 1.
#
#   scripts/fuzz.sh            # 60 s per target (what CI runs)
#   scripts/fuzz.sh 3600       # a longer run
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
out=${FUZZ_DIR:-build-fuzz}
build=${BUILD_DIR:-build}
cxx=${FUZZ_CXX:-clang++-19}
# Object files go through ccache when there is one (a fresh clone on a
# machine that built them before compiles nothing).
cc_launcher=""
command -v ccache > /dev/null && cc_launcher=ccache
mkdir -p "$out/obj"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
common="-std=c++17 -g -O1 $san -fno-omit-frame-pointer"

# The runtime, instrumented for coverage (fuzzer-no-link), compiled once.
mpi_compile=$(mpicxx --showme:compile)
mpi_link=$(mpicxx --showme:link)
# The runtime's sources: runtime/CMakeLists.txt's globs.
sources=(runtime/src/*.cpp runtime/src/cpu/*.cpp runtime/src/ops/*.cpp runtime/src/checkpoint/*.cpp
         runtime/src/tokenizer/*.cpp)
objs=()
for src in "${sources[@]}"; do
  objs+=("$out/obj/$(echo "$src" | tr / _).o")
done
# The newest header an object may depend on: an object older than it (or
# than its source) is compiled again.
newest_header=$(ls -t runtime/include/moert/*.h runtime/include/moert/*/*.h runtime/src/*.h \
                  runtime/src/*/*.h schema/include/moe/*.h | head -1)
for src in "${sources[@]}"; do
  obj="$out/obj/$(echo "$src" | tr / _).o"
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ "$newest_header" -nt "$obj" ]; then
    echo "$cc_launcher $cxx $common -fsanitize=fuzzer-no-link -Iruntime/include -Ischema/include -Iruntime/src $mpi_compile -c $src -o $obj"
  fi
done | xargs -P "$(nproc)" -I{} sh -c '{}'
for target in safetensors index manifest plan tokenizer; do
  upper=$(echo "$target" | tr a-z A-Z)
  $cc_launcher "$cxx" $common -fsanitize=fuzzer -DMOE_FUZZ_TARGET_$upper=1 -Iruntime/include \
    -Ischema/include -c tests/fuzz/fuzz_inputs.cpp -o "$out/obj/fuzz-$target.o"
  "$cxx" $common -fsanitize=fuzzer "$out/obj/fuzz-$target.o" "${objs[@]}" $mpi_link -lfmt \
    -lpcre2-8 -lutf8proc -lpthread -o "$out/fuzz-$target"
done
# The frontend's config reader against LLVM's support library.
llvm_flags=$(llvm-config-19 --cxxflags | sed 's/-std=c++[0-9]*//')
config_objs=()
for src in tests/fuzz/fuzz_inputs.cpp frontends/hf/lib/ModelConfig.cpp frontends/hf/lib/RopeScaling.cpp \
           frontends/hf/lib/CheckpointLayout.cpp; do
  obj="$out/obj/config_$(echo "$src" | tr / _).o"
  $cc_launcher "$cxx" $common -fsanitize=fuzzer-no-link $llvm_flags -DMOE_FUZZ_TARGET_CONFIG=1 \
    -Ifrontends/hf/include -c "$src" -o "$obj"
  config_objs+=("$obj")
done
"$cxx" $common -fsanitize=fuzzer "${config_objs[@]}" $(llvm-config-19 --ldflags) \
  $(llvm-config-19 --libs support) -o "$out/fuzz-config"

# Seed corpora.
seeds="$out/seeds"
rm -rf "$seeds" && mkdir -p "$seeds"/{config,safetensors,index,manifest,plan,tokenizer}
i=0
for f in tests/fixtures/models/*/config.json tests/fixtures/conformance/v*/*-r0[01]*/config.json \
         tests/frontends/hf/Inputs/*.json ../shared/configs/*/config.json; do
  [ -f "$f" ] && cp "$f" "$seeds/config/$((i++)).json"
done
for f in tests/fixtures/tokenizers/*/tokenizer.json tests/fixtures/models/*/tokenizer.json; do
  cp "$f" "$seeds/tokenizer/$((i++)).json"
done
for f in tests/fixtures/conformance/v5/*-r00/model.safetensors; do
  cp "$f" "$seeds/safetensors/$((i++)).safetensors"
done
python3 - "$seeds/index" <<'PY'
import json, sys
names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
json.dump({"metadata": {"total_size": 1000},
           "weight_map": {n: "model-0000%d-of-00002.safetensors" % (1 + k % 2) for k, n in enumerate(names)}},
          open(sys.argv[1] + "/index.json", "w"))
PY
moec="$build/tools/moec/moec" moert="$build/tools/moert/moert"
"$moec" compile tests/fixtures/models/mixtral/config.json -o "$seeds/plan/mixtral.plan" --max-seq-len 32
"$moec" compile tests/fixtures/models/deepseek_v3/config.json -o "$seeds/plan/deepseek_v3.plan" --max-seq-len 32
"$moec" compile tests/fixtures/models/qwen2_moe/config.json --world-size 2 --gpu cpu --dp 2 --ep 2 \
  -o "$seeds/plan/qwen2_moe-ep2.plan" --max-seq-len 32
"$moec" compile tests/fixtures/models/mixtral/config.json --world-size 2 --gpu cpu --tp 2 \
  -o "$out/tp2.plan" --max-seq-len 32
rm -rf "$out/ckpt" && "$moert" convert "$out/tp2.plan" --weights tests/fixtures/models/mixtral --out "$out/ckpt"
cp "$out/ckpt/manifest.json" "$seeds/manifest/"

status=0
for target in config safetensors index manifest plan tokenizer; do
  dir="$out/$target"
  mkdir -p "$dir/corpus"
  echo "fuzz: $target for $seconds s"
  if ! (cd "$dir" && ASAN_OPTIONS=detect_leaks=0 "../fuzz-$target" -max_total_time="$seconds" \
        -seed="${FUZZ_SEED:-1}" \
        -timeout=20 -rss_limit_mb=2048 -max_len=131072 -print_final_stats=1 \
        corpus "../seeds/$target" > log.txt 2>&1); then
    echo "fuzz: $target FOUND A PROBLEM (see $dir/log.txt and $dir/crash-*):"
    tail -40 "$dir/log.txt"
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$dir/log.txt" | sed "s/^/fuzz: $target /"
  fi
done
exit $status
