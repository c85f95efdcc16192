//===- Adjoints.cpp - each op's adjoint rule ----------------------*- C++ -*-===//
//
// AdjointOpInterface: the vector-Jacobian product of each differentiable op,
// built from the gradient ops of MoEGradientOps.td (moe-differentiate calls
// these in reverse program order). An operand that takes no gradient (ids,
// positions, labels) gets a null one. The loss terms' rule is special: the
// gradient of moe.lm_loss's operands is the lm_loss result itself (d loss /
// d term is the term's coefficient, which the term's own rule reads).
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"

using namespace mlir;
using namespace moe;

namespace {

RankedTensorType f32Like(Value v) {
  auto type = cast<RankedTensorType>(v.getType());
  return RankedTensorType::get(type.getShape(), Float32Type::get(v.getContext()));
}

} // namespace

LogicalResult EmbeddingOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                        SmallVectorImpl<Value> &operandGrads) {
  Value table = b.create<EmbeddingGradOp>(getLoc(), f32Like(getTable()), resultGrads[0],
                                          getTokens(), getPaddingIdxAttr());
  operandGrads.assign({table, Value()});
  return success();
}

LogicalResult RMSNormOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                      SmallVectorImpl<Value> &operandGrads) {
  // (moe-differentiate runs before moe-partition makes this form.)
  if (getSumSquares())
    return emitOpError("not supported yet: the gradient of a norm of rows that tensor "
                       "parallelism splits (sum_squares)");
  auto grad = b.create<RMSNormGradOp>(getLoc(), getInput().getType(), f32Like(getWeight()),
                                      resultGrads[0], getInput(), getWeight(),
                                      /*row_stats=*/Value(), getEpsilonAttr(),
                                      /*row_width=*/IntegerAttr());
  operandGrads.assign({grad.getInputGrad(), grad.getWeightGrad()});
  return success();
}

LogicalResult LinearOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                     SmallVectorImpl<Value> &operandGrads) {
  auto grad = b.create<LinearGradOp>(getLoc(), getInput().getType(), f32Like(getWeight()),
                                     resultGrads[0], getInput(), getWeight());
  operandGrads.assign({grad.getInputGrad(), grad.getWeightGrad()});
  if (getBias())
    operandGrads.push_back(
        b.create<BiasGradOp>(getLoc(), f32Like(getBias()), resultGrads[0]).getResult());
  return success();
}

LogicalResult AddOp::buildAdjoint(OpBuilder &, ArrayRef<Value> resultGrads,
                                  SmallVectorImpl<Value> &operandGrads) {
  operandGrads.assign({resultGrads[0], resultGrads[0]});
  return success();
}

LogicalResult RopeOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                   SmallVectorImpl<Value> &operandGrads) {
  Value grad = b.create<RopeGradOp>(getLoc(), resultGrads[0].getType(), resultGrads[0],
                                    getPositions(), getHeadDimAttr(), getRopeAttr());
  operandGrads.assign({grad, Value()});
  return success();
}

LogicalResult AttentionOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                        SmallVectorImpl<Value> &operandGrads) {
  auto grad = b.create<AttentionGradOp>(
      getLoc(), getQuery().getType(), getKey().getType(), getValue().getType(), resultGrads[0],
      getQuery(), getKey(), getValue(), getNumHeadsAttr(), getNumKvHeadsAttr(), getScaleAttr(),
      getSlidingWindowAttr());
  operandGrads.assign({grad.getQueryGrad(), grad.getKeyGrad(), grad.getValueGrad()});
  return success();
}

LogicalResult MLPOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                  SmallVectorImpl<Value> &operandGrads) {
  auto grad = b.create<MLPGradOp>(getLoc(), getInput().getType(), f32Like(getGateWeight()),
                                  f32Like(getUpWeight()), f32Like(getDownWeight()),
                                  resultGrads[0], getInput(), getGateWeight(), getUpWeight(),
                                  getDownWeight(), getActivationAttr());
  operandGrads.assign({grad.getInputGrad(), grad.getGateWeightGrad(), grad.getUpWeightGrad(),
                  grad.getDownWeightGrad()});
  return success();
}

LogicalResult CrossEntropyOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                           SmallVectorImpl<Value> &operandGrads) {
  // d loss / d ce is 1: the loss is the only reader of a cross-entropy.
  if (!resultGrads[0].getDefiningOp<LMLossOp>())
    return emitOpError("expected its gradient from moe.lm_loss (the loss's cross-entropy)");
  Value grad = b.create<CrossEntropyGradOp>(getLoc(), f32Like(getLogits()), getLogits(),
                                            getLabels(), getResult(), Value(), getVocabAttr());
  operandGrads.assign({grad, Value()});
  return success();
}

LogicalResult LMLossOp::buildAdjoint(OpBuilder &, ArrayRef<Value> resultGrads,
                                     SmallVectorImpl<Value> &operandGrads) {
  if (resultGrads[0] != getResult())
    return emitOpError("expected to be the differentiated loss");
  operandGrads.assign(getNumOperands(), getResult());
  return success();
}

LogicalResult RouterStatsOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                          SmallVectorImpl<Value> &operandGrads) {
  auto loss = resultGrads[0].getDefiningOp<LMLossOp>();
  if (!loss)
    return emitOpError("expected its gradient from moe.lm_loss (the loss's router statistics)");
  Value grad = b.create<RouterStatsGradOp>(getLoc(), f32Like(getLogits()), getLogits(),
                                           loss.getRouterStats(), loss.getAuxCoefAttr(),
                                           loss.getZCoefAttr());
  operandGrads.assign({grad});
  return success();
}

LogicalResult RouteOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                    SmallVectorImpl<Value> &operandGrads) {
  // Only the weights carry a gradient; the experts are a selection.
  operandGrads.assign(getNumOperands(), Value());
  if (!resultGrads[0])
    return success();
  operandGrads[0] = b.create<RouteGradOp>(getLoc(), f32Like(getLogits()), resultGrads[0],
                                          getLogits(), getExperts(), getRoutingAttr());
  return success();
}

/// moe.experts' and moe.experts_saved's rule: moe.experts_grad, reading the
/// saved activations where there are some.
template <class Op>
static void buildExpertsAdjoint(Op op, OpBuilder &b, Value dy, ValueRange saved,
                                FloatAttr capacityFactor, SmallVectorImpl<Value> &operandGrads) {
  auto grad = b.create<ExpertsGradOp>(
      op.getLoc(), op.getInput().getType(), f32Like(op.getWeights()),
      f32Like(op.getGateWeights()), f32Like(op.getUpWeights()), f32Like(op.getDownWeights()), dy,
      op.getInput(), op.getWeights(), op.getExperts(), op.getGateWeights(), op.getUpWeights(),
      op.getDownWeights(), saved, op.getActivationAttr(), capacityFactor);
  operandGrads.assign({grad.getInputGrad(), grad.getWeightsGrad(), Value(),
                       grad.getGateWeightsGrad(), grad.getUpWeightsGrad(),
                       grad.getDownWeightsGrad()});
}

LogicalResult ExpertsOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                      SmallVectorImpl<Value> &operandGrads) {
  buildExpertsAdjoint(*this, b, resultGrads[0], {}, FloatAttr(), operandGrads);
  return success();
}

LogicalResult ExpertsSavedOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                           SmallVectorImpl<Value> &operandGrads) {
  if (!resultGrads[0])
    return emitOpError("moe-differentiate: a gradient reaches only the saved activations");
  buildExpertsAdjoint(*this, b, resultGrads[0],
                      {getSavedGate(), getSavedUp(), getSavedOutput()},
                      getCapacityFactorAttr(), operandGrads);
  return success();
}

LogicalResult SigmoidGateOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                          SmallVectorImpl<Value> &operandGrads) {
  auto grad = b.create<SigmoidGateGradOp>(getLoc(), getInput().getType(), getGate().getType(),
                                          resultGrads[0], getInput(), getGate());
  operandGrads.assign({grad.getInputGrad(), grad.getGateGrad()});
  return success();
}

LogicalResult MLAttentionOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                          SmallVectorImpl<Value> &operandGrads) {
  auto grad = b.create<MLAttentionGradOp>(
      getLoc(), getQuery().getType(), getKv().getType(), getKeyRope().getType(), resultGrads[0],
      getQuery(), getKv(), getKeyRope(), getPositions(), getNumHeadsAttr(), getScaleAttr(),
      getRopeAttr());
  operandGrads.assign(
      {grad.getQueryGrad(), grad.getKvGrad(), grad.getKeyRopeGrad(), Value()});
  return success();
}

LogicalResult SplitOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                    SmallVectorImpl<Value> &operandGrads) {
  // The parts' gradients side by side (every part must have one: there is
  // no zero-filling op to stand for a part nothing reads).
  if (llvm::is_contained(resultGrads, Value()))
    return emitOpError("not supported yet: the gradient of a split with a part nothing reads");
  operandGrads.assign(
      {b.create<ConcatOp>(getLoc(), getInput().getType(), resultGrads).getResult()});
  return success();
}

LogicalResult ConcatOp::buildAdjoint(OpBuilder &b, ArrayRef<Value> resultGrads,
                                     SmallVectorImpl<Value> &operandGrads) {
  SmallVector<Type> parts;
  for (Value input : getInputs())
    parts.push_back(input.getType()); // (an activation's gradient has its type)
  auto split = b.create<SplitOp>(getLoc(), parts, resultGrads[0]);
  operandGrads.assign(split.getResults().begin(), split.getResults().end());
  return success();
}
