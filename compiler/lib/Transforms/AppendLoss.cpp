//===- AppendLoss.cpp - the training loss after the model --------*- C++ -*-===//
//
// moe-append-loss (moec compile --train): @forward(tokens, positions) ->
// logits becomes @forward(tokens, positions, labels) -> [loss, ce, aux, z],
// the loss transformers' *ForCausalLM computes with labels and
// output_router_logits (docs/training.md). The ops it appends are in
// MoETrainingOps.td.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/JSON.h"

namespace moe {
#define GEN_PASS_DEF_MOEAPPENDLOSS
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

/// The families whose transformers model adds load_balancing_loss_func to
/// the loss (with output_router_logits). DeepSeek-V3's adds none.
bool hasBalancingLoss(StringRef modelType) {
  static const llvm::StringSet<> families = {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"};
  return families.contains(modelType);
}

struct AppendLoss : moe::impl::MoEAppendLossBase<AppendLoss> {
  using MoEAppendLossBase::MoEAppendLossBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fn = module.lookupSymbol<func::FuncOp>("forward");
    if (!fn || fn.isExternal() || fn.getBody().getBlocks().size() != 1) {
      module.emitError("moe-append-loss: expected func.func @forward, the imported model");
      return signalPassFailure();
    }
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    auto vocab = module->getAttrOfType<IntegerAttr>("moe.vocab_size");
    if (body.getNumArguments() != 2 || ret.getNumOperands() != 1 || !vocab) {
      fn.emitError("moe-append-loss: expected @forward(tokens, positions) -> logits and "
                   "moe.vocab_size (an imported model, not yet trained or partitioned)");
      return signalPassFailure();
    }
    SmallVector<moe::RouteOp> routes;
    fn.walk([&](moe::RouteOp route) { routes.push_back(route); });
    auto modelType = module->getAttrOfType<StringAttr>("moe.model_type");
    StringRef family = modelType ? modelType.getValue() : "";

    // The coefficients: an explicit one, or the config's (transformers').
    double aux = 0;
    bool balancing = !routes.empty() && hasBalancingLoss(family);
    // DeepSeek-V3: transformers computes none; an explicit coefficient
    // trains the V3 paper's sequence-wise loss.
    const bool sequenceWise = !routes.empty() && family == "deepseek_v3" && auxLossCoef > 0;
    if (sequenceWise && sequences < 1) {
      fn.emitError("moe-append-loss: sequences must be >= 1");
      return signalPassFailure();
    }
    if (auxLossCoef >= 0) {
      if (!routes.empty() && !balancing && !sequenceWise && auxLossCoef > 0) {
        fn.emitError("moe-append-loss: not supported yet: aux-loss-coef for model_type '")
            << family << "' (transformers computes no balancing loss for it)";
        return signalPassFailure();
      }
      if (routes.empty() && auxLossCoef > 0) {
        fn.emitError("moe-append-loss: aux-loss-coef for a model without MoE layers");
        return signalPassFailure();
      }
      aux = auxLossCoef;
    } else if (balancing) {
      FailureOr<double> coef = configCoef(module);
      if (failed(coef))
        return signalPassFailure();
      aux = *coef;
    }
    if (zLossCoef < 0 || (zLossCoef > 0 && routes.empty())) {
      fn.emitError("moe-append-loss: z-loss-coef must be >= 0, and 0 for a model without MoE "
                   "layers");
      return signalPassFailure();
    }

    // transformers multiplies the router's input by random noise in
    // training mode; a run that differs from it at every step is refused.
    if (std::optional<double> jitter = configNumber(module, "router_jitter_noise");
        jitter && *jitter != 0) {
      fn.emitError("moe-append-loss: not supported yet: router_jitter_noise (")
          << *jitter << ") in training";
      return signalPassFailure();
    }

    OpBuilder b(module.getContext());
    Type f32 = b.getF32Type();
    SmallVector<Value> stats;
    if (aux > 0 || zLossCoef > 0) {
      for (moe::RouteOp route : routes) {
        b.setInsertionPointAfter(route);
        int64_t experts = route.getNumExperts();
        const int64_t perSequence = sequenceWise ? int64_t(sequences) : 0;
        stats.push_back(b.create<moe::RouterStatsOp>(
            route.getLoc(), RankedTensorType::get({3 + 2 * perSequence, experts}, f32),
            route.getLogits(), b.getI64IntegerAttr(route.getRouting().getTopK()),
            sequenceWise ? b.getI64IntegerAttr(perSequence) : IntegerAttr()));
      }
    }
    fn.insertArgument(2, RankedTensorType::get({ShapedType::kDynamic}, b.getI32Type()),
                      b.getDictionaryAttr(b.getNamedAttr("moe.name", b.getStringAttr("labels"))),
                      fn.getLoc());
    Value labels = body.getArgument(2);
    b.setInsertionPoint(ret);
    Value logits = ret.getOperand(0);
    auto ce = b.create<moe::CrossEntropyOp>(ret.getLoc(), RankedTensorType::get({2}, f32),
                                            logits, labels, vocab);
    auto loss = b.create<moe::LMLossOp>(ret.getLoc(), RankedTensorType::get({4}, f32), ce,
                                        stats, b.getF64FloatAttr(aux),
                                        b.getF64FloatAttr(zLossCoef));
    ret->setOperands(ValueRange{loss});
    fn.setType(FunctionType::get(module.getContext(), body.getArgumentTypes(),
                                 {loss.getType()}));
    fn->setAttr("moe.entry", b.getStringAttr("train"));
  }

  /// A number of the carried config.json (moe.config), if it has it.
  static std::optional<double> configNumber(ModuleOp module, StringRef field) {
    auto text = module->getAttrOfType<StringAttr>("moe.config");
    if (!text)
      return std::nullopt;
    llvm::Expected<llvm::json::Value> config = llvm::json::parse(text.getValue());
    if (!config) {
      llvm::consumeError(config.takeError());
      return std::nullopt;
    }
    const llvm::json::Object *object = config->getAsObject();
    return object ? object->getNumber(field) : std::nullopt;
  }

  /// router_aux_loss_coef of the carried config.json.
  FailureOr<double> configCoef(ModuleOp module) {
    std::optional<double> coef = configNumber(module, "router_aux_loss_coef");
    if (!coef || *coef < 0) {
      module.emitError("moe-append-loss: config.json has no router_aux_loss_coef >= 0 (the "
                       "balancing loss's coefficient); pass aux-loss-coef");
      return failure();
    }
    return *coef;
  }
};

} // namespace
