//===- Differentiate.cpp - the backward pass ----------------------*- C++ -*-===//
//
// moe-differentiate: reverse-mode differentiation of a training program
// (moe-append-loss's @forward) through each op's adjoint rule. One pass
// over the ops in reverse: an op whose results carry a gradient gets its
// rule applied at the end of the function (before the return), so every
// gradient op follows the gradients it reads; the forward values the rules
// read stay alive until then (the saved activations). docs/training.md.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"

namespace moe {
#define GEN_PASS_DEF_MOEDIFFERENTIATE
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

/// moe.experts as moe.experts_saved (the same result, and what its
/// gradient reads).
Operation *saveActivations(moe::ExpertsOp op, double capacityFactor) {
  OpBuilder b(op);
  auto rows = cast<RankedTensorType>(op.getInput().getType()).getDimSize(0);
  const int64_t k = op.getExperts().getType().getDimSize(1);
  const int64_t inter = op.getGateWeights().getType().getDimSize(1);
  const int64_t hidden = cast<RankedTensorType>(op.getInput().getType()).getDimSize(1);
  auto f32 = [&](int64_t width) { return RankedTensorType::get({rows, width}, b.getF32Type()); };
  auto saved = b.create<moe::ExpertsSavedOp>(
      op.getLoc(), op.getType(), f32(k * inter), f32(k * inter), f32(k * hidden), op.getInput(),
      op.getWeights(), op.getExperts(), op.getGateWeights(), op.getUpWeights(),
      op.getDownWeights(), op.getActivationAttr(),
      capacityFactor > 0 ? b.getF64FloatAttr(capacityFactor) : FloatAttr());
  saved->setDiscardableAttrs(op->getDiscardableAttrDictionary());
  op.getResult().replaceAllUsesWith(saved.getResult());
  op.erase();
  return saved;
}

struct Differentiate : moe::impl::MoEDifferentiateBase<Differentiate> {
  using MoEDifferentiateBase::MoEDifferentiateBase;

  /// With recompute-experts: whether these experts are recomputed
  /// (experts-layers names their decoder layer, or is empty).
  bool recomputedHere(moe::ExpertsOp experts) {
    if (expertsLayers.empty())
      return true;
    moe::WeightOpInterface w = moe::weightBehind(experts.getGateWeights());
    std::optional<int64_t> layer = w ? w.getDecoderLayer() : std::nullopt;
    return layer && llvm::is_contained(expertsLayers, *layer);
  }
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto fn = module.lookupSymbol<func::FuncOp>("forward");
    auto entry = fn ? fn->getAttrOfType<StringAttr>("moe.entry") : StringAttr();
    if (!fn || !entry || entry.getValue() != "train" || fn.getNumResults() != 1) {
      module.emitError("moe-differentiate: expected a training program (@forward after "
                       "moe-append-loss, not yet differentiated)");
      return signalPassFailure();
    }
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    Value loss = ret.getOperand(0);

    OpBuilder b(ret);
    // The gradient of each activation and of each weight (by its weight
    // op), summed where several ops contribute.
    DenseMap<Value, Value> grad;
    llvm::MapVector<Operation *, Value> weightGrad;
    grad[loss] = loss; // the seed: d loss / d loss (moe.lm_loss's rule reads it so)
    auto accumulate = [&](Value &slot, Value g) {
      slot = slot ? b.create<moe::AddOp>(g.getLoc(), slot, g).getResult() : g;
    };
    SmallVector<Operation *> ops;
    for (Operation &op : llvm::make_early_inc_range(body.without_terminator())) {
      auto experts = dyn_cast<moe::ExpertsOp>(&op);
      if (experts && recomputeExperts && capacityFactor > 0) {
        experts.emitError("moe-differentiate: not supported yet: recompute-experts with a "
                          "capacity factor (the experts' drops are moe.experts_saved's)");
        return signalPassFailure();
      }
      if (!experts || (recomputeExperts && recomputedHere(experts))) {
        ops.push_back(&op);
        continue;
      }
      ops.push_back(saveActivations(experts, capacityFactor));
    }
    for (Operation *op : llvm::reverse(ops)) {
      if (isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op))
        continue;
      SmallVector<Value> resultGrads;
      bool any = false;
      for (Value r : op->getResults()) {
        resultGrads.push_back(grad.lookup(r));
        any |= static_cast<bool>(resultGrads.back());
      }
      if (!any)
        continue;
      auto rule = dyn_cast<moe::AdjointOpInterface>(op);
      if (!rule) {
        op->emitError("moe-differentiate: not supported yet: the gradient of '")
            << op->getName() << "'";
        return signalPassFailure();
      }
      SmallVector<Value> operandGrads;
      if (failed(rule.buildAdjoint(b, resultGrads, operandGrads)))
        return signalPassFailure();
      for (auto [operand, g] : llvm::zip(op->getOperands(), operandGrads)) {
        if (!g)
          continue;
        if (moe::WeightOpInterface w = moe::weightBehind(operand))
          accumulate(weightGrad[w.getOperation()], g);
        else
          accumulate(grad[operand], g);
      }
    }

    // The loss, then the weights' gradients in the order the ops first bind
    // the weights (the order of the exec program's weights).
    SmallVector<Value> results{loss};
    SmallVector<Attribute> names;
    llvm::DenseSet<Operation *> listed;
    for (Operation *op : ops)
      for (Value operand : op->getOperands()) {
        moe::WeightOpInterface w = moe::weightBehind(operand);
        if (!w || isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op) ||
            !listed.insert(w.getOperation()).second)
          continue;
        auto found = weightGrad.find(w.getOperation());
        if (found == weightGrad.end())
          continue;
        results.push_back(found->second);
        names.push_back(b.getStringAttr(w.getTensorName()));
      }
    ret->setOperands(results);
    fn.setType(FunctionType::get(module.getContext(), body.getArgumentTypes(),
                                 ValueRange(results).getTypes()));
    SmallVector<DictionaryAttr> attrs{b.getDictionaryAttr({})};
    for (Attribute name : names)
      attrs.push_back(b.getDictionaryAttr(b.getNamedAttr("moe.gradient_of", name)));
    fn.setAllResultAttrs(attrs);
  }
};

} // namespace
