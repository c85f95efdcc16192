//===- Moec.cpp - the moec compiler driver ---------------------*- C++ -*-===//
//
//   moec inspect CONFIG [--json]   model summary and exact parameter counts
//   moec import CONFIG [-o FILE]   the model's `moe` IR
//
//===----------------------------------------------------------------------===//
#include "moe/Driver/Moec.h"
#include "MoecOptions.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Frontend/HF/Importer.h"
#include "moe/InitAll.h"
#include "moe/Pipelines.h"
#include "moe/Analysis/Planner.h"
#include "moe/Target/Cuda.h"
#include "moe/Target/Distribution.h"
#include "moe/Target/PlanReport.h"
#include "moe/Target/PlanWriter.h"
#include "moe/Target/TargetBackend.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/Pass/PassManager.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/Base64.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
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


cl::opt<std::string> compileConfig(cl::Positional, cl::Required,
                                   cl::desc("<config.json>"),
                                   cl::sub(driver::compileSubcommand()));
cl::opt<std::string> compileOutput(
    "o", cl::desc("Write the plan (or, with --compile-to, the IR) to <file>"),
    cl::value_desc("file"), cl::sub(driver::compileSubcommand()));
cl::opt<std::string> compileTo(
    "compile-to",
    cl::desc("Stop after this phase and print its IR: import, workload, "
             "partition, buffers, exec (default: plan, which writes the plan file); "
             "kernels: with --target cuda, write the CUDA sources (and the plan "
             "with its kernel tables) to the -o directory, or the sources to "
             "standard output, without running nvcc"),
    cl::value_desc("phase"), cl::init("plan"), cl::sub(driver::compileSubcommand()));
cl::opt<std::string> compileTarget(
    "target",
    cl::desc("What the plan runs on: cpu (default) or cuda (each program's kernels "
             "emitted as CUDA C++ and compiled by nvcc into a fatbin, both carried in the plan; "
             "docs/cuda.md)"),
    cl::value_desc("target"), cl::init("cpu"), cl::sub(driver::compileSubcommand()));
cl::opt<std::string> cudaArchs(
    "cuda-arch",
    cl::desc("With --target cuda: the GPU architectures to compile SASS for, plus PTX "
             "(comma-separated, default sm_80,sm_90)"),
    cl::value_desc("sm_XY,..."), cl::init("sm_80,sm_90"), cl::sub(driver::compileSubcommand()));
cl::opt<int64_t> maxBatchTokens(
    "max-batch-tokens",
    cl::desc("Most tokens processed in one step; prompts longer than this are "
             "prefilled in chunks (default 512)"),
    cl::init(512), cl::sub(driver::compileSubcommand()));
cl::opt<int64_t> maxSeqLen(
    "max-seq-len",
    cl::desc("Longest sequence, prompt plus generated tokens; sizes the KV "
             "cache (at most the model's max_position_embeddings; default: "
             "that, capped at 4096)"),
    cl::init(0), cl::sub(driver::compileSubcommand()));
cl::opt<int64_t> maxSequences(
    "max-sequences",
    cl::desc("Most sequences decoded together (KV-cache slots, default 8)"),
    cl::init(8), cl::sub(driver::compileSubcommand()));

cl::opt<double> capacityFactor(
    "capacity-factor",
    cl::desc("Expert capacity: each expert takes at most ceil(F x tokens x k / "
             "experts) tokens of a step, the rest are dropped (pass through the "
             "residual); default 0: dropless (docs/partitioned-execution.md)"),
    cl::init(0.0), cl::sub(driver::compileSubcommand()));

cl::opt<bool> decodeEntry(
    "decode-entry",
    cl::desc("Give every rank a decode program beside its prefill program: its steps hold at "
             "most one token per sequence (--max-sequences), so its dispatch blocks and "
             "buffers are that small; moert runs prompts with the prefill entry and "
             "generated tokens with the decode entry (docs/plan-format.md, schedule)"),
    cl::init(false), cl::sub(driver::compileSubcommand()));

cl::opt<bool> noFuse(
    "no-fuse",
    cl::desc("Skip the fusion passes (moe-fuse-router): every op of the model runs as its own "
             "step, to tell a fusion's numbers from the unfused ones"),
    cl::init(false), cl::sub(driver::compileSubcommand()));

// Distribution (the sharding planner).
cl::OptionCategory distribution("Distribution (any of these runs the sharding planner)");
cl::opt<int64_t> worldSize("world-size", cl::desc("Number of ranks (devices) to plan for"),
                           cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<std::string> gpu("gpu",
                         cl::desc("Device kind of a built-in machine: h100, h200, a100, "
                                  "b200 or cpu (figures and sources: compiler/machines/)"),
                         cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<std::string> clusterFile(
    "cluster", cl::desc("A cluster description (JSON, see compiler/machines/README.md)"),
    cl::value_desc("file"), cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<int64_t> fixedDp("dp", cl::desc("Fix the data-parallel degree"), cl::init(0),
                         cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<int64_t> fixedPp("pp", cl::desc("Fix the pipeline-parallel degree"), cl::init(0),
                         cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<int64_t> fixedTp("tp", cl::desc("Fix the tensor-parallel degree (divides the heads)"),
                         cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<int64_t> fixedEp("ep", cl::desc("Fix the expert-parallel degree (divides the experts)"),
                         cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<int64_t> fixedEtp("etp",
                          cl::desc("Fix the expert tensor-parallel degree (divides the "
                                   "expert width)"),
                          cl::init(0), cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<int64_t> vocabPadTo(
    "vocab-pad-to",
    cl::desc("Pad the vocabulary to a multiple of this x tp (default 64); the padding "
             "never reaches logits or checkpoints"),
    cl::init(64), cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<std::string> planDtype(
    "dtype",
    cl::desc("Weight dtype the planner counts: bf16, f16, f32 or fp8 (default: the "
             "config's torch_dtype; DeepSeek-V3 publishes fp8 weights)"),
    cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<std::string> weightFormat(
    "weight-format",
    cl::desc("int8: keep the linear layers' and experts' matrices as symmetric int8 with an "
             "f32 scale per row and 128 columns, quantised by moert at load (CPU target; "
             "docs/quantization.md)"),
    cl::sub(driver::compileSubcommand()));
cl::opt<std::string> fp8Activations(
    "fp8-activations",
    cl::desc("FP8 checkpoints: dynamic (the config's activation_scheme, the default with "
             "--target cuda: activations quantised per 1 x 128 before each FP8 GEMM, "
             "cuBLASLt's FP8 GEMM on sm_90) or none (the default with --target cpu: "
             "unquantised activations times the dequantised weights; docs/quantization.md)"),
    cl::sub(driver::compileSubcommand()));
cl::opt<bool> explain("explain",
                      cl::desc("Print the chosen layout, the best alternatives with "
                               "per-rank memory and time, and why the rest were rejected"),
                      cl::sub(driver::compileSubcommand()), cl::cat(distribution));
cl::opt<bool> printJson("json",
                        cl::desc("Print the layout as one JSON object (world_size, degrees, "
                                 "vocab, ranks with their memory and weight slices)"),
                        cl::sub(driver::compileSubcommand()), cl::cat(distribution));

cl::opt<std::string> compileReport(
    "report",
    cl::desc("Also write the plan's report, one HTML page (as moec report does; needs -o)"),
    cl::value_desc("report.html"), cl::sub(driver::compileSubcommand()));

cl::SubCommand reportCommand(
    "report", "Draw a plan as one self-contained HTML page: mesh, experts, memory, "
              "time, layouts considered, vocabulary, slices (docs/plan-report.md)");
cl::opt<std::string> reportPlan(cl::Positional, cl::Required, cl::desc("<plan>"),
                                cl::sub(reportCommand));
cl::opt<std::string> reportOutput("o", cl::desc("Write the report to <file>"),
                                  cl::value_desc("report.html"), cl::Required,
                                  cl::sub(reportCommand));
cl::opt<std::string> reportMeasured(
    "measured",
    cl::desc("Draw the figures of `moert run --report-json FILE` beside the predictions"),
    cl::value_desc("FILE"), cl::sub(reportCommand));

cl::SubCommand planInfoCommand("plan-info", "Describe an existing plan's distribution");
cl::opt<std::string> planInfoPath(cl::Positional, cl::Required, cl::desc("<plan>"),
                                  cl::sub(planInfoCommand));
cl::opt<bool> planInfoJson("json",
                           cl::desc("Print one JSON object (world_size, degrees, vocab, ranks)"),
                           cl::sub(planInfoCommand));

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

/// Prints `module` to `path` ("-": standard output).
int writeIR(mlir::ModuleOp module, StringRef path) {
  std::error_code ec;
  ToolOutputFile out(path, ec, llvm::sys::fs::OF_None);
  if (ec)
    return fail(createStringError(ec, "%s: cannot write: %s", path.str().c_str(),
                                  ec.message().c_str()));
  module->print(out.os());
  out.os() << "\n";
  out.os().flush();
  if (out.os().has_error()) {
    std::string why = out.os().error().message();
    out.os().clear_error(); // else the stream's destructor aborts the process
    return fail(createStringError(inconvertibleErrorCode(), "%s: cannot write: %s",
                                  path.str().c_str(), why.c_str()));
  }
  out.keep();
  return kExitOk;
}

/// A config.json imported into `context`, with its parsed config.
struct Imported {
  hf::ModelConfig config;
  mlir::OwningOpRef<mlir::ModuleOp> module;
};

Expected<Imported> loadAndImport(StringRef path, mlir::MLIRContext &context) {
  Expected<hf::ModelConfig> config = hf::loadModelConfig(path);
  if (!config)
    return config.takeError();
  auto module = hf::importModel(*config, context);
  if (!module)
    return module.takeError();
  return Imported{std::move(*config), std::move(*module)};
}

/// A context with every dialect a `moe` module may use.
mlir::DialectRegistry allDialects() {
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  return registry;
}

int runImport() {
  mlir::MLIRContext context(allDialects());
  Expected<Imported> imported = loadAndImport(importConfig, context);
  if (!imported)
    return fail(imported.takeError());
  return writeIR(*imported->module, importOutput);
}


int runCompile() {
  const bool kernelsOnly = compileTo == "kernels";
  std::optional<Phase> last = kernelsOnly ? std::optional<Phase>(Phase::Plan) : parsePhase(compileTo);
  if (!lookupTargetBackend(compileTarget))
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--target: unknown target '%s' (expected %s)",
                                  compileTarget.c_str(), targetBackendNames().c_str()));
  const bool cudaTarget = compileTarget == "cuda";
  if (kernelsOnly && !cudaTarget)
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--compile-to=kernels: expected --target cuda"));
  if (cudaTarget) {
    Expected<std::vector<std::string>> archs = cuda::parseArchs(cudaArchs);
    if (!archs)
      return fail(archs.takeError());
    if (!kernelsOnly && cuda::findNvcc().empty())
      return fail(createStringError(
          inconvertibleErrorCode(),
          "--target cuda: nvcc not found (set MOE_NVCC, or install the CUDA toolkit at "
          "/usr/local/cuda; --compile-to=kernels writes the sources without nvcc)"));
  }
  if (!last)
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--compile-to: unknown phase '%s' (expected "
                                  "one of: %s)",
                                  compileTo.c_str(), phaseNames()));
  if (capacityFactor < 0)
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--capacity-factor: expected a value >= 0 (0: "
                                  "dropless) but got %g",
                                  double(capacityFactor)));
  if (!planDtype.empty() && !sharding::parseDType(planDtype))
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--dtype %s: expected bf16, f16, f32 or fp8",
                                  planDtype.c_str()));
  if (!compileReport.empty() && (*last != Phase::Plan || compileOutput.empty() || kernelsOnly))
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--report: expected a plan to draw (-o PLAN, no --compile-to)"));
  if (*last == Phase::Plan && compileOutput.empty() && !explain && !printJson && !kernelsOnly)
    return fail(createStringError(inconvertibleErrorCode(),
                                  "-o: expected the plan's output path"));
  if (*last == Phase::Plan && cudaTarget && !kernelsOnly && compileOutput.empty() &&
      !explain && !printJson)
    return fail(createStringError(inconvertibleErrorCode(),
                                  "--target cuda: expected the plan's output path (-o)"));
  mlir::MLIRContext context(allDialects());
  Expected<Imported> imported = loadAndImport(compileConfig, context);
  if (!imported)
    return fail(imported.takeError());
  const hf::ModelConfig *config = &imported->config;
  mlir::OwningOpRef<mlir::ModuleOp> &module = imported->module;

  // Pass diagnostics become one "moec: error: FILE: message" line.
  mlir::ScopedDiagnosticHandler diagnostics(&context, [](mlir::Diagnostic &d) {
    std::string where;
    if (auto file = mlir::dyn_cast<mlir::FileLineColLoc>(d.getLocation()))
      where = file.getFilename().str() + ": ";
    WithColor::error(errs(), "moec") << where << d.str() << "\n";
    return mlir::success();
  });
  // A long prompt is prefilled in chunks of max-batch-tokens, so only the
  // sequence length is bounded by the model.
  CompileOptions options;
  options.maxBatchTokens = maxBatchTokens;
  options.maxSeqLen = maxSeqLen ? int64_t(maxSeqLen)
                                : std::min<int64_t>(config->maxPositionEmbeddings, 4096);
  options.maxSequences = maxSequences;
  options.capacityFactor = capacityFactor;
  options.fuse = !noFuse;
  // The sharding planner (moe-choose-layout) runs when any distribution
  // option is given.
  const bool distribution = worldSize || !gpu.empty() || !clusterFile.empty() || fixedDp ||
                            !planDtype.empty() || fixedPp || fixedTp || fixedEp || fixedEtp ||
                            explain || printJson;
  if (distribution || capacityFactor != 0)
    options.layout = LayoutRequest{worldSize, gpu,     clusterFile, planDtype, fixedDp,
                                   fixedPp,   fixedTp, fixedEp,     fixedEtp,  vocabPadTo};
  options.explain = explain;
  options.json = printJson;
  options.target = compileTarget;
  // An FP8 checkpoint is planned as stored unless --dtype counts it in
  // another dtype (as if dequantised).
  options.storedSlices = config->fp8.has_value() && planDtype.empty();
  if (!weightFormat.empty()) {
    const char *refusal = weightFormat != "int8" ? "expected int8"
                          : cudaTarget           ? "not supported yet with --target cuda"
                          : config->fp8          ? "not supported yet for FP8 weights "
                                                   "(quantization_config)"
                                                 : nullptr;
    if (refusal)
      return fail(createStringError(inconvertibleErrorCode(), "%s: --weight-format %s: %s",
                                    config->path.c_str(), weightFormat.c_str(), refusal));
    options.weightFormat = weightFormat;
  }
  if (!fp8Activations.empty() || (cudaTarget && config->fp8)) {
    const std::string scheme = fp8Activations.empty() ? "dynamic" : std::string(fp8Activations);
    const char *refusal = scheme != "dynamic" && scheme != "none" ? "expected dynamic or none"
                          : !config->fp8 ? "the checkpoint has no FP8 weights (quantization_config)"
                                   : nullptr;
    if (refusal)
      return fail(createStringError(inconvertibleErrorCode(), "%s: --fp8-activations %s: %s",
                                    config->path.c_str(), scheme.c_str(), refusal));
    if (scheme == "dynamic")
      options.fp8Activations = scheme;
  }
  options.cudaArch = cudaArchs;
  options.kernelsOnly = kernelsOnly;
  options.decodeEntry = decodeEntry;
  // (--explain with --train prints the training memory model instead of
  // the planner's choice.)
  const bool plannerOptions = worldSize || !gpu.empty() || !clusterFile.empty() || fixedDp ||
                              !planDtype.empty() || fixedPp || fixedTp || fixedEp || fixedEtp ||
                              printJson;
  if (Error e = driver::trainingOptions(options, *config, plannerOptions,
                                         {&maxBatchTokens, &maxSeqLen, &maxSequences, &decodeEntry}))
    return fail(std::move(e));
  if (options.train && !options.weightFormat.empty())
    return fail(createStringError(inconvertibleErrorCode(),
                                  "%s: --weight-format %s: not supported yet with --train",
                                  config->path.c_str(), weightFormat.c_str()));
  if (!options.checkpointDtype.empty()) {
    // --param-dtype bf16: the model's weights in bf16 (their slices in the
    // checkpoint's dtype).
    hf::ModelConfig compute = *config;
    compute.dtype = "bfloat16";
    compute.correctionBiasF32 = true;
    auto converted = hf::importModel(compute, context);
    if (!converted)
      return fail(converted.takeError());
    module = std::move(*converted);
  }
  // Where the plan goes: -o, or DIR/plan.json for --compile-to=kernels -o DIR
  // (the sources beside it).
  options.output = compileOutput;
  if (kernelsOnly && !compileOutput.empty()) {
    SmallString<256> dir(compileOutput.getValue());
    if (std::error_code ec = sys::fs::create_directories(dir))
      return fail(createStringError(ec, "%s: cannot create: %s", dir.c_str(),
                                    ec.message().c_str()));
    sys::path::append(dir, "plan.json");
    options.output = dir.str().str();
  }
  if (Error e = driver::chooseRecompute(context, *module, options, *config))
    return fail(std::move(e));
  if (!options.fp8Activations.empty() && !options.train)
    (*module)->setAttr("moe.fp8_activations",
                       mlir::StringAttr::get(&context, options.fp8Activations));
  if (options.ranksPerProcess > 1)
    (*module)->setAttr("moe.ranks_per_process",
                       mlir::IntegerAttr::get(mlir::IntegerType::get(&context, 64),
                                              options.ranksPerProcess));
  mlir::PassManager pm(&context);
  buildPipeline(pm, options, *last);
  if (mlir::failed(pm.run(*module)))
    return kExitBadInput; // the pass printed a diagnostic naming the option or file
  if (*last != Phase::Plan)
    return writeIR(*module, compileOutput.empty() ? "-" : compileOutput.getValue());
  if (!compileReport.empty())
    if (Error e = moe::writePlanReport(options.output, "", compileReport))
      return fail(std::move(e));
  return kExitOk;
}

int runPlanInfo() {
  auto buffer = MemoryBuffer::getFile(planInfoPath);
  if (!buffer)
    return fail(createStringError(buffer.getError(), "%s: cannot read: %s",
                                  planInfoPath.c_str(), buffer.getError().message().c_str()));
  Expected<json::Value> plan = json::parse((*buffer)->getBuffer());
  if (!plan)
    return fail(createStringError(inconvertibleErrorCode(), "%s: not a plan: %s",
                                  planInfoPath.c_str(), toString(plan.takeError()).c_str()));
  json::Object *root = plan->getAsObject();
  if (!root || root->getString("format") != moe::plan::kFormat)
    return fail(createStringError(inconvertibleErrorCode(),
                                  "%s: not a plan (no \"format\": \"moe-plan\")",
                                  planInfoPath.c_str()));
  json::Object info;
  for (StringRef key :
       {"world_size", "ranks_per_process", "degrees", "vocab", "stage_begin", "schedule",
        "fp8_activations"})
    if (const json::Value *v = root->get(key))
      info[key] = *v;
  json::Array ranks;
  if (const json::Array *all = root->getArray("ranks"))
    for (const json::Value &r : *all) {
      const json::Object *rank = r.getAsObject();
      if (!rank)
        continue;
      json::Object entry;
      for (StringRef key : {"rank", "coords", "memory", "weights", "weights_of_rank"})
        if (const json::Value *v = rank->get(key))
          entry[key] = *v;
      ranks.push_back(std::move(entry));
    }
  info["ranks"] = std::move(ranks);
  if (planInfoJson) {
    outs() << formatv("{0:2}", json::Value(std::move(info))) << "\n";
    return kExitOk;
  }
  const json::Object *degrees = info.getObject("degrees");
  outs() << "plan        " << planInfoPath << "\n";
  outs() << "world size  " << info.getInteger("world_size").value_or(1) << "\n";
  // (moec compile --tp-arithmetic: several ranks a process.)
  if (int64_t perProcess = info.getInteger("ranks_per_process").value_or(1); perProcess > 1)
    outs() << formatv("processes   {0}, {1} ranks each\n",
                      info.getInteger("world_size").value_or(1) / perProcess, perProcess);
  if (degrees)
    outs() << formatv("degrees     dp={0} pp={1} tp={2} ep={3} etp={4}\n",
                      degrees->getInteger("dp").value_or(1), degrees->getInteger("pp").value_or(1),
                      degrees->getInteger("tp").value_or(1), degrees->getInteger("ep").value_or(1),
                      degrees->getInteger("etp").value_or(1));
  if (const json::Object *vocab = info.getObject("vocab"))
    outs() << formatv("vocab       {0} (padded {1})\n", vocab->getInteger("size").value_or(0),
                      vocab->getInteger("padded").value_or(0));
  // How FP8 GEMMs take their activations (moec compile --fp8-activations).
  if (std::optional<StringRef> scheme = info.getString("fp8_activations"))
    outs() << "fp8 acts    " << *scheme << " (quantised per 1 x 128 before each FP8 GEMM)\n";
  // Which entry runs each phase (plans with several entries per rank).
  if (const json::Object *schedule = info.getObject("schedule"))
    outs() << formatv("schedule    prefill: {0}, decode: {1}\n",
                      schedule->getString("prefill").value_or(""),
                      schedule->getString("decode").value_or(""));
  return kExitOk;
}

} // namespace

cl::SubCommand &moe::driver::compileSubcommand() {
  static cl::SubCommand command("compile", "Compile a Hugging Face config.json into a plan that moert runs");
  return command;
}

int moe::moecMain(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::ParseCommandLineOptions(
      argc, argv,
      "moec: the MoE model compiler\n\n"
      "  moec inspect CONFIG [--json]   summary and exact parameter counts\n"
      "  moec import CONFIG [-o FILE]   the model as moe-dialect IR\n"
      "  moec compile CONFIG -o PLAN    a plan for moert (see moec compile --help)\n"
      "  moec compile CONFIG --world-size N --gpu h100 [--explain] [--json] [-o PLAN]\n"
      "                                 choose the sharding and say why\n"
      "  moec plan-info PLAN [--json]   a plan's distribution\n"
      "  moec report PLAN -o report.html [--measured FILE]   the plan as one HTML page\n\n"
      "Bad input (a missing, mistyped or inconsistent config field) is "
      "reported as 'FILE: field 'NAME': ...' with exit code 2.\n");
  if (inspectCommand)
    return runInspect();
  if (importCommand)
    return runImport();
  if (driver::compileSubcommand())
    return runCompile();
  if (planInfoCommand)
    return runPlanInfo();
  if (reportCommand) {
    if (Error e = moe::writePlanReport(reportPlan, reportMeasured, reportOutput))
      return fail(std::move(e));
    return kExitOk;
  }
  errs() << "moec: expected a command (inspect, import, compile, plan-info, report); see moec "
            "--help\n";
  return kExitBadInput;
}
