//===- Layout.cpp - the sharding planner on a module -------------*- C++ -*-===//
#include "moe/Transforms/Layout.h"
#include "moe/Frontend/HF/ModelConfig.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"

using namespace mlir;
namespace sh = moe::sharding;

static llvm::Error layoutError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

llvm::Expected<moe::PlannedLayout> moe::planLayout(ModuleOp module,
                                                   const LayoutRequest &request) {
  auto source = module->getAttrOfType<StringAttr>("moe.source");
  if (!source)
    return layoutError("expected moe.source (the config.json the module was imported from)");
  auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
  if (!workload)
    return layoutError("expected moe.workload (run moe-specialize-workload first)");
  auto integer = [&](StringRef key) -> int64_t {
    auto v = workload.getAs<IntegerAttr>(key);
    return v ? v.getInt() : 0;
  };
  llvm::Expected<hf::ModelConfig> config = hf::loadModelConfig(source.getValue());
  if (!config)
    return config.takeError();
  std::optional<sh::DType> dtype;
  if (!request.dtype.empty()) {
    dtype = sh::parseDType(request.dtype);
    if (!dtype)
      return layoutError("--dtype " + request.dtype + ": expected bf16, f16, f32 or fp8");
  }
  llvm::Expected<sh::ModelInfo> model = sh::ModelInfo::build(*config, dtype);
  if (!model)
    return model.takeError();
  llvm::Expected<sh::Cluster> cluster =
      !request.cluster.empty()
          ? sh::loadClusterFile(request.cluster)
          : sh::makeCluster(request.gpu.empty() ? "cpu" : request.gpu,
                            request.worldSize ? request.worldSize : 1);
  if (cluster && !request.cluster.empty() && request.worldSize)
    cluster = sh::withWorldSize(*cluster, request.worldSize);
  if (!cluster)
    return cluster.takeError();
  sh::Workload w{integer("max_batch_tokens"), integer("max_seq_len"), integer("max_sequences")};
  sh::PlanOptions options;
  options.vocabPadTo = request.vocabPadTo;
  sh::FixedDegrees fixed;
  auto set = [](std::optional<int64_t> &slot, int64_t v) {
    if (v)
      slot = v;
  };
  set(fixed.dp, request.dp);
  set(fixed.pp, request.pp);
  set(fixed.tp, request.tp);
  set(fixed.ep, request.ep);
  set(fixed.etp, request.etp);
  llvm::Expected<sh::PlanResult> result = sh::planSharding(*model, *cluster, w, options, fixed);
  if (!result)
    return result.takeError();
  return PlannedLayout{std::move(*model), std::move(*cluster), w, std::move(*result)};
}

void moe::setLayoutAttr(ModuleOp module, const LayoutRequest &request,
                        const sh::ShardingLayout &chosen) {
  Builder b(module.getContext());
  const sh::Degrees &d = chosen.degrees;
  SmallVector<NamedAttribute> entries = {
      b.getNamedAttr("world_size", b.getI64IntegerAttr(request.worldSize)),
      b.getNamedAttr("gpu", b.getStringAttr(request.gpu)),
      b.getNamedAttr("cluster", b.getStringAttr(request.cluster)),
      b.getNamedAttr("dtype", b.getStringAttr(request.dtype)),
      b.getNamedAttr("vocab_pad_to", b.getI64IntegerAttr(request.vocabPadTo)),
      b.getNamedAttr("dp", b.getI64IntegerAttr(d.dp)),
      b.getNamedAttr("pp", b.getI64IntegerAttr(d.pp)),
      b.getNamedAttr("tp", b.getI64IntegerAttr(d.tp)),
      b.getNamedAttr("ep", b.getI64IntegerAttr(d.ep)),
      b.getNamedAttr("etp", b.getI64IntegerAttr(d.etp)),
      b.getNamedAttr("stage_begin", b.getDenseI64ArrayAttr(chosen.stageBegin))};
  module->setAttr("moe.layout", b.getDictionaryAttr(entries));
}

llvm::Expected<std::unique_ptr<moe::PlannedLayout>> moe::recordedLayout(ModuleOp module) {
  auto layout = module->getAttrOfType<DictionaryAttr>("moe.layout");
  if (!layout)
    return nullptr;
  LayoutRequest request;
  auto integer = [&](StringRef key, int64_t &slot) -> llvm::Error {
    auto v = layout.getAs<IntegerAttr>(key);
    if (!v)
      return layoutError("moe.layout: expected an integer '" + key + "'");
    slot = v.getInt();
    return llvm::Error::success();
  };
  auto string = [&](StringRef key, std::string &slot) -> llvm::Error {
    auto v = layout.getAs<StringAttr>(key);
    if (!v)
      return layoutError("moe.layout: expected a string '" + key + "'");
    slot = v.getValue().str();
    return llvm::Error::success();
  };
  for (auto [key, slot] : {std::pair<StringRef, int64_t *>{"world_size", &request.worldSize},
                           {"vocab_pad_to", &request.vocabPadTo},
                           {"dp", &request.dp},
                           {"pp", &request.pp},
                           {"tp", &request.tp},
                           {"ep", &request.ep},
                           {"etp", &request.etp}})
    if (llvm::Error e = integer(key, *slot))
      return std::move(e);
  for (auto [key, slot] : {std::pair<StringRef, std::string *>{"gpu", &request.gpu},
                           {"cluster", &request.cluster},
                           {"dtype", &request.dtype}})
    if (llvm::Error e = string(key, *slot))
      return std::move(e);
  auto stages = layout.getAs<DenseI64ArrayAttr>("stage_begin");
  if (!stages)
    return layoutError("moe.layout: expected the stage_begin array");
  llvm::Expected<PlannedLayout> planned = planLayout(module, request);
  if (!planned)
    return planned.takeError();
  if (llvm::ArrayRef<int64_t>(planned->result.chosen().layout.stageBegin) != stages.asArrayRef())
    return layoutError("moe.layout: the planner no longer places the recorded stages");
  return std::make_unique<PlannedLayout>(std::move(*planned));
}
