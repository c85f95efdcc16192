//===- Moec.cpp - the moec compiler driver ---------------------*- C++ -*-===//
//
//   moec inspect CONFIG [--json]   model summary and exact parameter counts
//   moec import CONFIG [-o FILE]   the model's `moe` IR
//
//===----------------------------------------------------------------------===//
#include "moe/Driver/Moec.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Frontend/HF/Importer.h"
#include "moe/InitAll.h"
#include "moe/Pipelines.h"
#include "moe/Target/PlanWriter.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"
#include "llvm/Support/WithColor.h"

using namespace llvm;
using namespace moe;

namespace {

cl::SubCommand inspectCommand(
    "inspect", "Print a summary of a Hugging Face config.json: architecture, "
               "sizes, routing and exact parameter counts");
cl::SubCommand importCommand(
    "import", "Import a Hugging Face config.json into the moe dialect and "
              "print the IR");

cl::opt<std::string> inspectConfig(cl::Positional, cl::Required,
                                   cl::desc("<config.json>"),
                                   cl::sub(inspectCommand));
cl::opt<bool> inspectJson(
    "json",
    cl::desc("Print one JSON object (model_type, num_layers, num_experts, "
             "experts_per_token, vocab_size, hidden_size, params: {total, "
             "active, ...}) instead of text"),
    cl::sub(inspectCommand));

cl::SubCommand compileCommand(
    "compile", "Compile a Hugging Face config.json into a plan that moert runs");
cl::opt<std::string> compileConfig(cl::Positional, cl::Required,
                                   cl::desc("<config.json>"),
                                   cl::sub(compileCommand));
cl::opt<std::string> compileOutput(
    "o", cl::desc("Write the plan (or, with --compile-to, the IR) to <file>"),
    cl::value_desc("file"), cl::sub(compileCommand));
cl::opt<std::string> compileTo(
    "compile-to",
    cl::desc("Stop after this phase and print its IR: import, workload, "
             "buffers (default: plan, which writes the plan file)"),
    cl::value_desc("phase"), cl::init("plan"), cl::sub(compileCommand));
cl::opt<int64_t> maxBatchTokens(
    "max-batch-tokens",
    cl::desc("Most tokens processed in one step; prompts longer than this are "
             "prefilled in chunks (default 512)"),
    cl::init(512), cl::sub(compileCommand));
cl::opt<int64_t> maxSeqLen(
    "max-seq-len",
    cl::desc("Longest sequence, prompt plus generated tokens; sizes the KV "
             "cache (at most the model's max_position_embeddings; default: "
             "that, capped at 4096)"),
    cl::init(0), cl::sub(compileCommand));
cl::opt<int64_t> maxSequences(
    "max-sequences",
    cl::desc("Most sequences decoded together (KV-cache slots, default 8)"),
    cl::init(8), cl::sub(compileCommand));

cl::opt<std::string> importConfig(cl::Positional, cl::Required,
                                  cl::desc("<config.json>"),
                                  cl::sub(importCommand));
cl::opt<std::string> importOutput("o", cl::desc("Write the IR to <file> "
                                                "(default: standard output)"),
                                  cl::value_desc("file"), cl::init("-"),
                                  cl::sub(importCommand));

int fail(Error error, int code = kExitBadInput) {
  WithColor::error(errs(), "moec") << toString(std::move(error)) << "\n";
  return code;
}

std::string withCommas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0)
      out += ',';
    out += digits[i];
  }
  return out;
}

const char *scoringName(const hf::ModelConfig &c) {
  return c.scoring == hf::Scoring::Sigmoid ? "sigmoid" : "softmax";
}

int runInspect() {
  Expected<hf::ModelConfig> config = hf::loadModelConfig(inspectConfig);
  if (!config)
    return fail(config.takeError());
  const hf::ModelConfig &c = *config;
  hf::ParamCounts p = hf::countParameters(c);
  if (inspectJson) {
    json::Object params{{"total", p.total},
                        {"active", p.active},
                        {"embedding", p.embedding},
                        {"lm_head", p.lmHead},
                        {"routed_experts", p.routedExperts},
                        {"mtp", p.mtp}};
    json::Object o{
        {"model_type", c.modelType},
        {"num_layers", c.numLayers},
        {"num_moe_layers", c.numMoELayers()},
        {"num_experts", c.numExperts},
        {"experts_per_token", c.expertsPerToken},
        {"num_shared_experts", c.numSharedExperts},
        {"vocab_size", c.vocabSize},
        {"hidden_size", c.hiddenSize},
        {"num_attention_heads", c.numHeads},
        {"num_key_value_heads", c.numKVHeads},
        {"head_dim", c.headDim},
        {"dtype", c.dtype},
        {"tie_word_embeddings", c.tieWordEmbeddings},
        {"importable", c.unsupportedFeature.empty()},
        {"params", std::move(params)}};
    if (!c.unsupportedFeature.empty())
      o["unsupported_feature"] = c.unsupportedFeature;
    outs() << formatv("{0:2}", json::Value(std::move(o))) << "\n";
    return kExitOk;
  }
  auto row = [](StringRef key, const Twine &value) {
    outs() << formatv("{0,-14}", key) << value << "\n";
  };
  row("model", c.modelType + " (" + c.path + ")");
  row("layers", formatv("{0} ({1} MoE, {2} dense)", c.numLayers,
                        c.numMoELayers(), c.numLayers - c.numMoELayers()));
  if (c.isMLA())
    row("attention",
        formatv("MLA, {0} heads, q_lora {1}, kv_lora {2}, qk {3}+{4}, v {5}",
                c.numHeads, c.qLoraRank, c.kvLoraRank, c.qkNopeHeadDim,
                c.qkRopeHeadDim, c.vHeadDim));
  else
    row("attention", formatv("{0} heads, {1} KV heads, head_dim {2}",
                             c.numHeads, c.numKVHeads, c.headDim));
  row("hidden", formatv("{0}, dense MLP {1}", c.hiddenSize, c.intermediateSize));
  if (c.isMoE())
    row("experts",
        formatv("{0} routed (width {1}), top-{2}, {3}{4}{5}; {6} shared",
                c.numExperts, c.moeIntermediateSize, c.expertsPerToken,
                scoringName(c), c.normTopK ? ", renormalised" : "",
                c.numGroups > 1 ? formatv(", {0} groups keep {1}", c.numGroups,
                                          c.topkGroups).str()
                                : std::string(),
                c.numSharedExperts));
  row("vocab", formatv("{0}{1}", c.vocabSize,
                       c.tieWordEmbeddings ? " (tied LM head)" : ""));
  row("dtype", c.dtype);
  row("parameters", formatv("{0} total, {1} active per token",
                            withCommas(p.total), withCommas(p.active)));
  if (p.mtp)
    row("", formatv("+ {0} in {1} MTP module(s), not counted above",
                    withCommas(p.mtp), c.numMTPLayers));
  row("import", c.unsupportedFeature.empty()
                    ? "supported"
                    : "not supported yet: " + c.unsupportedFeature);
  return kExitOk;
}

int runImport() {
  Expected<hf::ModelConfig> config = hf::loadModelConfig(importConfig);
  if (!config)
    return fail(config.takeError());
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  auto module = hf::importModel(*config, context);
  if (!module)
    return fail(module.takeError());
  std::error_code ec;
  ToolOutputFile out(importOutput, ec, llvm::sys::fs::OF_None);
  if (ec)
    return fail(createStringError(ec, "%s: cannot write: %s",
                                  importOutput.c_str(), ec.message().c_str()));
  (**module)->print(out.os());
  out.os() << "\n";
  out.keep();
  return kExitOk;
}

int runCompile() {
  std::optional<Phase> last = parsePhase(compileTo);
  if (!last)
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--compile-to: unknown phase '%s' (expected "
                                  "one of: %s)",
                                  compileTo.c_str(), phaseNames()));
  if (*last == Phase::Plan && compileOutput.empty())
    return fail(createStringError(inconvertibleErrorCode(),
                                  "-o: expected the plan's output path"));
  Expected<hf::ModelConfig> config = hf::loadModelConfig(compileConfig);
  if (!config)
    return fail(config.takeError());
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  auto module = hf::importModel(*config, context);
  if (!module)
    return fail(module.takeError());

  // Pass diagnostics become one "moec: error: FILE: message" line.
  mlir::ScopedDiagnosticHandler diagnostics(&context, [](mlir::Diagnostic &d) {
    std::string where;
    if (auto file = mlir::dyn_cast<mlir::FileLineColLoc>(d.getLocation()))
      where = file.getFilename().str() + ": ";
    WithColor::error(errs(), "moec") << where << d.str() << "\n";
    return mlir::success();
  });
  mlir::PassManager pm(&context);
  int64_t seqLen = maxSeqLen ? int64_t(maxSeqLen)
                             : std::min<int64_t>(config->maxPositionEmbeddings, 4096);
  WorkloadOptions workload{maxBatchTokens, seqLen, maxSequences};
  // A long prompt is prefilled in chunks of max-batch-tokens, so only the
  // sequence length is bounded by the model.
  buildPipeline(pm, workload, *last);
  if (mlir::failed(pm.run(**module)))
    return kExitBadInput; // the pass printed a diagnostic naming the option

  if (*last != Phase::Plan) {
    std::string path = compileOutput.empty() ? "-" : compileOutput.getValue();
    std::error_code ec;
    ToolOutputFile out(path, ec, llvm::sys::fs::OF_None);
    if (ec)
      return fail(createStringError(ec, "%s: cannot write: %s", path.c_str(),
                                    ec.message().c_str()));
    (**module)->print(out.os());
    out.os() << "\n";
    out.keep();
    return kExitOk;
  }
  Expected<json::Value> plan = buildPlan(**module);
  if (!plan)
    return fail(plan.takeError(), kExitFailure);
  if (Error e = writePlanFile(*plan, compileOutput))
    return fail(std::move(e));
  return kExitOk;
}

} // namespace

int moe::moecMain(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(
      argc, argv,
      "moec: the MoE model compiler\n\n"
      "  moec inspect CONFIG [--json]   summary and exact parameter counts\n"
      "  moec import CONFIG [-o FILE]   the model as moe-dialect IR\n"
      "  moec compile CONFIG -o PLAN    a plan for moert (see moec compile --help)\n\n"
      "Bad input (a missing, mistyped or inconsistent config field) is "
      "reported as 'FILE: field 'NAME': ...' with exit code 2.\n");
  if (inspectCommand)
    return runInspect();
  if (importCommand)
    return runImport();
  if (compileCommand)
    return runCompile();
  errs() << "moec: expected a command (inspect, import, compile); see moec --help\n";
  return kExitBadInput;
}
