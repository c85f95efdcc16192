//===- TrainingOps.cpp - verifiers of the loss ops ---------------*- C++ -*-===//
#include "moe/Dialect/MoE/IR/MoEOps.h"

using namespace mlir;
using namespace moe;

namespace {
ArrayRef<int64_t> shapeOf(Value v) { return cast<RankedTensorType>(v.getType()).getShape(); }
} // namespace

void CrossEntropyOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "ce");
}

LogicalResult CrossEntropyOp::verify() {
  ArrayRef<int64_t> logits = shapeOf(getLogits());
  if (ShapedType::isDynamic(logits[1]))
    return emitOpError("expected a static logits width");
  if (getVocab() < 1 || getVocab() > logits[1])
    return emitOpError("expected 1 <= vocab <= ")
           << logits[1] << " (the logits' width) but got " << getVocab();
  int64_t labels = shapeOf(getLabels())[0];
  if (!ShapedType::isDynamic(labels) && !ShapedType::isDynamic(logits[0]) && labels != logits[0])
    return emitOpError("expected one label per logits row (") << logits[0] << ") but got "
                                                               << labels;
  if (shapeOf(getResult()) != ArrayRef<int64_t>{2})
    return emitOpError("expected a tensor<2xf32> result (sum, rows) but got ")
           << getResult().getType();
  return success();
}

void VocabStatsOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "vocab_stats");
}

LogicalResult VocabStatsOp::verify() {
  if (shapeOf(getResult())[1] != 4 || getVocab() < 1)
    return emitOpError("expected [T, 4] statistics (max, sum hi, sum lo, target) and vocab >= 1");
  return success();
}

void CrossEntropyOfStatsOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "ce");
}

LogicalResult CrossEntropyOfStatsOp::verify() {
  const int64_t width = shapeOf(getStats())[1];
  if (ShapedType::isDynamic(width) || width % 4 || shapeOf(getResult()) != ArrayRef<int64_t>{2})
    return emitOpError("expected the parts' statistics [T, 4 n] and a tensor<2xf32> result");
  return success();
}

void RouterStatsOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "router_stats");
}

LogicalResult RouterStatsOp::verify() {
  ArrayRef<int64_t> logits = shapeOf(getLogits());
  int64_t experts = logits[1];
  if (ShapedType::isDynamic(experts) || experts < 2)
    return emitOpError("expected a static number of experts >= 2 but got ")
           << getLogits().getType();
  if (getTopK() < 1 || getTopK() > experts)
    return emitOpError("expected 1 <= top_k <= ") << experts << " but got " << getTopK();
  const int64_t rows = 3 + 2 * getSequences().value_or(0);
  if (getSequences() && (*getSequences() < 1 || experts < 3))
    return emitOpError("expected sequences >= 1 and 3 or more experts");
  if (shapeOf(getResult()) != ArrayRef<int64_t>{rows, experts})
    return emitOpError("expected a tensor<") << rows << "x" << experts << "xf32> result but got "
                                              << getResult().getType();
  return success();
}

void LMLossOp::getAsmResultNames(OpAsmSetValueNameFn setName) { setName(getResult(), "loss"); }

LogicalResult LMLossOp::verify() {
  if (shapeOf(getCrossEntropy()) != ArrayRef<int64_t>{2})
    return emitOpError("expected the cross-entropy as tensor<2xf32> but got ")
           << getCrossEntropy().getType();
  for (Value stats : getRouterStats())
    if (stats.getType() != getRouterStats().front().getType())
      return emitOpError("expected every layer's router statistics as ")
             << getRouterStats().front().getType() << " but got " << stats.getType();
  if (!getRouterStats().empty() && (shapeOf(getRouterStats().front())[0] < 3 ||
                                    shapeOf(getRouterStats().front())[0] % 2 == 0))
    return emitOpError("expected router statistics of 3 rows (or 3 + 2 per sequence) but got ")
           << getRouterStats().front().getType();
  if (getAuxCoef().convertToDouble() < 0 || getZCoef().convertToDouble() < 0)
    return emitOpError("expected coefficients >= 0");
  if (shapeOf(getResult()) != ArrayRef<int64_t>{4})
    return emitOpError("expected a tensor<4xf32> result (loss, ce, aux, z) but got ")
           << getResult().getType();
  return success();
}

//===----------------------------------------------------------------------===//
// The backward pass's ops (MoEGradientOps.td)
//===----------------------------------------------------------------------===//

namespace {
/// `a` and `b` have the same static size in dimension `i` (or either is ?).
bool agree(Value a, unsigned i, Value b, unsigned j) {
  int64_t x = shapeOf(a)[i], y = shapeOf(b)[j];
  return ShapedType::isDynamic(x) || ShapedType::isDynamic(y) || x == y;
}
} // namespace

void CrossEntropyGradOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "dlogits");
}

LogicalResult CrossEntropyGradOp::verify() {
  if (getResult().getType() != RankedTensorType::get(shapeOf(getLogits()),
                                                     Float32Type::get(getContext())))
    return emitOpError("expected an f32 result of the logits' shape");
  if (getStats() && (ShapedType::isDynamic(shapeOf(getStats())[1]) || shapeOf(getStats())[1] % 4))
    return emitOpError("expected the parts' statistics [T, 4 n] (moe.vocab_stats)");
  if (shapeOf(getCrossEntropy()) != ArrayRef<int64_t>{2})
    return emitOpError("expected the cross-entropy as tensor<2xf32>");
  return success();
}

LogicalResult LinearGradOp::verify() {
  if (!agree(getGrad(), 1, getWeight(), 0) || !agree(getInput(), 1, getWeight(), 1) ||
      !agree(getGrad(), 0, getInput(), 0))
    return emitOpError("expected dy [T, out], x [T, in] and the weight [out, in]");
  if (getInputGrad().getType() != getInput().getType() ||
      shapeOf(getWeightGrad()) != shapeOf(getWeight()))
    return emitOpError("expected the gradients in the shapes of the input and the weight");
  return success();
}

LogicalResult RMSNormGradOp::verify() {
  if (getGrad().getType() != getInput().getType() ||
      getInputGrad().getType() != getInput().getType() ||
      shapeOf(getWeightGrad()) != shapeOf(getWeight()))
    return emitOpError("expected dy and dx of the input's type and dw of the weight's shape");
  if (Value stats = getRowStats()) {
    auto type = cast<RankedTensorType>(stats.getType());
    if (!type.getElementType().isF32() || type.getRank() != 2 ||
        (!type.isDynamicDim(1) && type.getDimSize(1) != 2))
      return emitOpError("expected row_stats of [T, 2] f32 but got ") << type;
    const int64_t width = cast<RankedTensorType>(getInput().getType()).getDimSize(1);
    if (shapeOf(getWeight()) != ArrayRef<int64_t>{width})
      return emitOpError("with row_stats, expected the weight of the input width");
    auto rowWidth = getRowWidth();
    if (!rowWidth || *rowWidth < 1 || (!ShapedType::isDynamic(width) && *rowWidth % width))
      return emitOpError("with row_stats, expected row_width: a multiple of the input width");
  } else if (getRowWidth()) {
    return emitOpError("row_width: only with row_stats");
  }
  return success();
}

LogicalResult RMSNormGradStatsOp::verify() {
  auto type = cast<RankedTensorType>(getResult().getType());
  if (!type.getElementType().isF32() || (!type.isDynamicDim(1) && type.getDimSize(1) != 2))
    return emitOpError("expected a result of [T, 2] f32 but got ") << type;
  if (getGrad().getType() != getInput().getType() ||
      shapeOf(getWeight()) !=
          ArrayRef<int64_t>{cast<RankedTensorType>(getInput().getType()).getDimSize(1)})
    return emitOpError("expected dy of the input's type and the weight of its width");
  return success();
}

LogicalResult AttentionGradOp::verify() {
  if (getQueryGrad().getType() != getQuery().getType() ||
      getKeyGrad().getType() != getKey().getType() ||
      getValueGrad().getType() != getValue().getType() || !agree(getGrad(), 1, getQuery(), 1))
    return emitOpError("expected the gradients in the types of query, key and value");
  if (getNumHeads() < 1 || getNumKvHeads() < 1 || getNumHeads() % getNumKvHeads())
    return emitOpError("expected kv_heads to divide heads");
  return success();
}

LogicalResult MLPGradOp::verify() {
  if (getInputGrad().getType() != getInput().getType() ||
      shapeOf(getGateWeightGrad()) != shapeOf(getGateWeight()) ||
      shapeOf(getUpWeightGrad()) != shapeOf(getUpWeight()) ||
      shapeOf(getDownWeightGrad()) != shapeOf(getDownWeight()))
    return emitOpError("expected the gradients in the shapes of the input and the weights");
  return success();
}

void EmbeddingGradOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "dtable");
}

LogicalResult EmbeddingGradOp::verify() {
  if (!agree(getGrad(), 1, getResult(), 1) || !agree(getGrad(), 0, getTokens(), 0) ||
      ShapedType::isDynamic(shapeOf(getResult())[0]))
    return emitOpError("expected dy [T, H], T ids and a static [V, H] result");
  return success();
}

void RopeGradOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "drot");
}

void RouteGradOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "dgate");
}

LogicalResult RouteGradOp::verify() {
  if (shapeOf(getGrad()) != shapeOf(getExperts()) ||
      shapeOf(getResult()) != shapeOf(getLogits()) ||
      shapeOf(getGrad())[1] != getRouting().getTopK())
    return emitOpError("expected dw and the experts [T, top_k] and a result of the logits' shape");
  return success();
}

/// moe.experts_saved's saved results (or moe.experts_grad's operands):
/// per row, k blocks of I (gate, up) and of H (output).
static LogicalResult verifySaved(Operation *op, ValueRange saved, Value input, Value experts,
                                 Value gateWeights) {
  const int64_t rows = shapeOf(input)[0], hidden = shapeOf(input)[1];
  const int64_t k = shapeOf(experts)[1], inter = shapeOf(gateWeights)[1];
  const int64_t widths[] = {k * inter, k * inter, k * hidden};
  for (auto [value, width] : llvm::zip(saved, widths)) {
    ArrayRef<int64_t> shape = shapeOf(value);
    if (shape[0] != rows || shape[1] != width)
      return op->emitOpError("expected saved activations [")
             << (ShapedType::isDynamic(rows) ? "?" : std::to_string(rows)) << ", " << widths[0]
             << "], [same], [" << (ShapedType::isDynamic(rows) ? "?" : std::to_string(rows))
             << ", " << widths[2] << "] (k blocks of the gate/up products and of the outputs "
             << "per token) but got " << value.getType();
  }
  return success();
}

LogicalResult ExpertsSavedOp::verify() {
  if (getCapacityFactor() && !(getCapacityFactor()->convertToDouble() >= 0))
    return emitOpError("expected capacity_factor >= 0 (0: dropless)");
  if (failed(verifyExpertsOperands(*this, getInput(), getWeights(), getExperts(),
                                   getGateWeights(), getUpWeights(), getDownWeights())))
    return failure();
  return verifySaved(*this, {getSavedGate(), getSavedUp(), getSavedOutput()}, getInput(),
                     getExperts(), getGateWeights());
}

LogicalResult ExpertsGradOp::verify() {
  if (getInputGrad().getType() != getInput().getType() ||
      shapeOf(getWeightsGrad()) != shapeOf(getWeights()) ||
      shapeOf(getGateWeightsGrad()) != shapeOf(getGateWeights()) ||
      shapeOf(getUpWeightsGrad()) != shapeOf(getUpWeights()) ||
      shapeOf(getDownWeightsGrad()) != shapeOf(getDownWeights()))
    return emitOpError("expected the gradients in the shapes of the input, the routing weights "
                       "and the expert stacks");
  if (getCapacityFactor() && !(getCapacityFactor()->convertToDouble() >= 0))
    return emitOpError("expected capacity_factor >= 0 (0: dropless)");
  if (!getSaved().empty() && getSaved().size() != 3)
    return emitOpError("expected no saved activations or three (gate, up, output) but got ")
           << getSaved().size();
  return verifySaved(*this, getSaved(), getInput(), getExperts(), getGateWeights());
}

LogicalResult CombineGradOp::verify() {
  if (getSlots().getType().getShape() != getWeights().getType().getShape() ||
      shapeOf(getWeightsGrad()) != shapeOf(getWeights()))
    return emitOpError("expected slots, weights and their gradient of the same shape");
  if (!agree(getGrad(), 1, getOutputs(), 2) || !agree(getGrad(), 0, getSlots(), 0))
    return emitOpError("expected one gradient row per token, as wide as the expert outputs");
  return success();
}

LogicalResult ExpertFFNGradOp::verify() {
  ArrayRef<int64_t> gate = getGateWeights().getType().getShape();
  if (shapeOf(getGateWeightsGrad()) != shapeOf(getGateWeights()) ||
      shapeOf(getUpWeightsGrad()) != shapeOf(getUpWeights()) ||
      shapeOf(getDownWeightsGrad()) != shapeOf(getDownWeights()))
    return emitOpError("expected the weight gradients in the shapes of the expert stacks");
  const int64_t experts = getBuffer().getType().getDimSize(0);
  if (getCounts().getType().getDimSize(0) != experts)
    return emitOpError("expected one count per expert");
  if (experts % gate[0])
    return emitOpError("expected the buffer's experts (")
           << experts << ") to be a multiple of the local experts (" << gate[0] << ")";
  ArrayRef<int64_t> up = shapeOf(getUpWeights()), down = shapeOf(getDownWeights());
  if (up != gate || down[0] != gate[0] || gate[2] != getBuffer().getType().getDimSize(2) ||
      down[1] != gate[2] || down[2] != gate[1])
    return emitOpError("expected expert stacks that form MLPs of the blocks' width");
  return success();
}

void DispatchGradOp::getAsmResultNames(OpAsmSetValueNameFn setName) { setName(getResult(), "dx"); }

LogicalResult DispatchGradOp::verify() {
  if (!agree(getResult(), 1, getGrad(), 2) || !agree(getResult(), 0, getSlots(), 0))
    return emitOpError("expected one row per token, as wide as the blocks");
  return success();
}

void RouterStatsGradOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "dgate");
}

void BiasGradOp::getAsmResultNames(OpAsmSetValueNameFn setName) { setName(getResult(), "dbias"); }

LogicalResult BiasGradOp::verify() {
  if (!agree(getGrad(), 1, getResult(), 0))
    return emitOpError("expected a result as long as dy's rows are wide");
  return success();
}
