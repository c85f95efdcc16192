// libFuzzer targets for every file a user hands moec or moert (issue 11):
// built by scripts/fuzz.sh with clang, -fsanitize=fuzzer,address,undefined,
// one binary per target (-DMOE_FUZZ_TARGET=...). Bad input must end in the
// tools' one-line errors (InputError / llvm::Error); anything else (a crash,
// a sanitizer report, an internal error, a hang, memory past the limit) is a
// finding.
//
//   config       config.json: parse, validate, count parameters
//   safetensors  a .safetensors file: header, entries, every tensor's data
//   index        model.safetensors.index.json (its shards absent)
//   manifest     a sharded checkpoint's manifest.json (its files absent)
//   plan         a plan: the integrity seal recomputed first, so that the
//                structural checks behind it are what is fuzzed
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

#if MOE_FUZZ_TARGET_CONFIG
#include "moe/Frontend/HF/ModelConfig.h"
#else
#include "moert/Checkpoint.h"
#include "moert/Error.h"
#include "moert/Plan.h"
#include "moert/PlanLayout.h"
#include "moert/PlanSeal.h"
#include "moert/ShardedCheckpoint.h"
#include "moert/Tokenizer.h"
#endif

namespace {

/// A directory of this process's own for the input files.
const std::string &workDir() {
  static const std::string dir = [] {
    char templ[] = "/tmp/moe-fuzz-XXXXXX";
    if (!::mkdtemp(templ))
      std::abort();
    return std::string(templ);
  }();
  return dir;
}

std::string writeFile(const std::string &name, const uint8_t *data, size_t size) {
  std::string path = workDir() + "/" + name;
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    std::abort();
  if (size)
    std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
#if MOE_FUZZ_TARGET_CONFIG
  std::string text(reinterpret_cast<const char *>(data), size);
  llvm::Expected<moe::hf::ModelConfig> config = moe::hf::parseModelConfig(text, "config.json");
  if (!config) {
    llvm::consumeError(config.takeError());
    return 0;
  }
  (void)moe::hf::countParameters(*config);
  return 0;
#else
  try {
#if MOE_FUZZ_TARGET_SAFETENSORS
    std::string path = writeFile("model.safetensors", data, size);
    auto file = moert::SafetensorsFile::open(path);
    for (const std::string &name : file->names()) {
      moert::TensorView view = file->tensor(name);
      volatile float sum = 0;
      for (int64_t i = 0; i < view.numel() && i < 4096; ++i)
        sum = sum + view.at(i);
    }
#elif MOE_FUZZ_TARGET_INDEX
    std::string path = writeFile("model.safetensors.index.json", data, size);
    (void)moert::Checkpoint::open(path);
#elif MOE_FUZZ_TARGET_MANIFEST
    writeFile("manifest.json", data, size);
    (void)moert::ShardedCheckpoint::open(workDir());
#elif MOE_FUZZ_TARGET_PLAN
    std::string text(reinterpret_cast<const char *>(data), size);
    if (text.rfind('}') != std::string::npos)
      text = moert::sealPlanText(text);
    std::string path = writeFile("model.plan", reinterpret_cast<const uint8_t *>(text.data()),
                                 text.size());
    moert::Plan plan = moert::Plan::load(path);
    (void)moert::PlanLayout::load(path);
#elif MOE_FUZZ_TARGET_TOKENIZER
    std::string path = writeFile("tokenizer.json", data, size);
    moert::Tokenizer tokenizer = moert::Tokenizer::load(path);
    // Encode a mixed text and the input's own start; decode ids around the
    // vocabulary's edges.
    std::string text = "Hello <s> world 123 \xF0\x9F\x98\x80 \xC3(";
    text.append(reinterpret_cast<const char *>(data), size < 256 ? size : 256);
    std::vector<int32_t> ids = tokenizer.encode(text);
    for (int32_t id = 0; id < 300 && id < tokenizer.size(); ++id)
      ids.push_back(id);
    ids.push_back(static_cast<int32_t>(tokenizer.size()));
    ids.push_back(-1);
    (void)tokenizer.decode(ids);
    (void)tokenizer.decode(ids, true);
#else
#error "define one MOE_FUZZ_TARGET_*"
#endif
  } catch (const moert::InputError &) {
    return 0; // the one-line error users get
  }
  return 0;
#endif
}
