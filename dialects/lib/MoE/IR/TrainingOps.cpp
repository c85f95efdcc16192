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
  if (shapeOf(getResult()) != ArrayRef<int64_t>{3, experts})
    return emitOpError("expected a tensor<3x") << experts << "xf32> result but got "
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
  if (!getRouterStats().empty() && shapeOf(getRouterStats().front())[0] != 3)
    return emitOpError("expected router statistics of 3 rows but got ")
           << getRouterStats().front().getType();
  if (getAuxCoef().convertToDouble() < 0 || getZCoef().convertToDouble() < 0)
    return emitOpError("expected coefficients >= 0");
  if (shapeOf(getResult()) != ArrayRef<int64_t>{4})
    return emitOpError("expected a tensor<4xf32> result (loss, ce, aux, z) but got ")
           << getResult().getType();
  return success();
}
