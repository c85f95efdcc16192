//===- LowerRouting.cpp - moe.experts -> dispatch / expert_ffn / combine -===//
//
// moe-lower-routing: routed experts as the three steps that capacity limits
// and expert parallelism need: moe.dispatch (each kept (token, choice) row
// into its expert's block of C slots), moe.expert_ffn (every expert's MLP
// over its block) and moe.combine (the weighted sum back per token). It
// decides the capacity; moe-partition then places the blocks (all_to_all
// over EP, row parts over TP) and never lowers routing itself.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SmallVector.h"

#include <algorithm>
#include <cmath>

namespace moe {
#define GEN_PASS_DEF_MOELOWERROUTING
#include "moe/Transforms/Passes.h.inc"

int64_t dispatchCapacity(double factor, int64_t tokens, int64_t k, int64_t experts) {
  if (factor <= 0)
    return tokens;
  double c = std::ceil(factor * double(tokens) * double(k) / double(experts));
  return std::min<int64_t>(tokens, static_cast<int64_t>(c));
}
} // namespace moe

using namespace mlir;

namespace {

/// The degree of `key` in the module's layout (moe.sharding), 1 if none.
int64_t degreeOf(ModuleOp module, StringRef key) {
  auto sharding = module->getAttrOfType<DictionaryAttr>("moe.sharding");
  auto a = sharding ? sharding.getAs<IntegerAttr>(key) : nullptr;
  return a ? a.getInt() : int64_t(1);
}

/// Whether the module's layout needs the lowered form: expert or tensor
/// parallelism (moe.sharding), or a capacity limit.
bool needsLowering(ModuleOp module, double capacityFactor) {
  return capacityFactor > 0 || degreeOf(module, "ep") > 1 || degreeOf(module, "tp") > 1;
}

/// The lowered form of one routed-experts op.
struct Lowered {
  moe::DispatchOp dispatch;
  Value out; // the expert outputs' blocks (what combine reads)
};

struct LowerRoutingPass : moe::impl::MoELowerRoutingBase<LowerRoutingPass> {
  using MoELowerRoutingBase::MoELowerRoutingBase;

  /// dispatch / expert_ffn / combine in place of a forward experts op.
  Lowered lowerForward(Operation *op, int64_t maxTokens, Value input, Value weights,
                       Value experts, Value gate, Value up, Value down,
                       moe::ActivationAttr activation) {
    OpBuilder b(op);
    Location loc = op->getLoc();
    auto stack = cast<RankedTensorType>(gate.getType());
    const int64_t numExperts = stack.getDimSize(0);
    const int64_t k = cast<RankedTensorType>(experts.getType()).getDimSize(1);
    auto inputType = cast<RankedTensorType>(input.getType());
    const int64_t capacity = moe::dispatchCapacity(capacityFactor, maxTokens, k, numExperts);
    auto bufferType = RankedTensorType::get({numExperts, capacity, inputType.getDimSize(1)},
                                            inputType.getElementType());
    auto countsType = RankedTensorType::get({numExperts}, b.getI32Type());
    // One row part (moe-partition splits the rows of a TP group).
    auto dispatch = b.create<moe::DispatchOp>(
        loc, bufferType, countsType, experts.getType(), input, experts,
        b.getI64IntegerAttr(capacity), b.getF64FloatAttr(capacityFactor),
        b.getI64IntegerAttr(1), b.getI64IntegerAttr(1));
    Value out = b.create<moe::ExpertFFNOp>(loc, bufferType, dispatch.getBuffer(),
                                           dispatch.getCounts(), gate, up, down, activation);
    Value combined = b.create<moe::CombineOp>(loc, inputType, out, dispatch.getSlots(), weights);
    op->getResult(0).replaceAllUsesWith(combined);
    return {dispatch, out};
  }

  /// A training program's experts_grad as the transpose of its forward's
  /// lowered form: combine_grad, expert_ffn_grad, dispatch_grad (whose
  /// blocks moe-partition exchanges as the forward's).
  void lowerGradient(moe::ExpertsGradOp op, Lowered forward) {
    OpBuilder b(op);
    Location loc = op.getLoc();
    Value buffer = forward.dispatch.getBuffer();
    auto combine = b.create<moe::CombineGradOp>(loc, forward.out.getType(),
                                                op.getWeightsGrad().getType(), op.getGrad(),
                                                forward.out, forward.dispatch.getSlots(),
                                                op.getWeights());
    auto ffn = b.create<moe::ExpertFFNGradOp>(
        loc, buffer.getType(), op.getGateWeightsGrad().getType(),
        op.getUpWeightsGrad().getType(), op.getDownWeightsGrad().getType(),
        combine.getOutputsGrad(), buffer, forward.dispatch.getCounts(), op.getGateWeights(),
        op.getUpWeights(), op.getDownWeights(), op.getActivationAttr());
    auto dx = b.create<moe::DispatchGradOp>(loc, op.getInputGrad().getType(),
                                            ffn.getBufferGrad(), forward.dispatch.getSlots());
    op.getInputGrad().replaceAllUsesWith(dx.getResult());
    op.getWeightsGrad().replaceAllUsesWith(combine.getWeightsGrad());
    op.getGateWeightsGrad().replaceAllUsesWith(ffn.getGateWeightsGrad());
    op.getUpWeightsGrad().replaceAllUsesWith(ffn.getUpWeightsGrad());
    op.getDownWeightsGrad().replaceAllUsesWith(ffn.getDownWeightsGrad());
    op.erase();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (capacityFactor < 0) {
      module.emitError("expected capacity-factor >= 0 (0: dropless) but got ") << capacityFactor;
      return signalPassFailure();
    }
    auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
    auto maxTokens = workload ? workload.getAs<IntegerAttr>("max_batch_tokens") : nullptr;
    if (!maxTokens) {
      module.emitError("expected moe.workload (moe-specialize-workload) before lowering routing: "
                       "the capacity is a function of max_batch_tokens");
      return signalPassFailure();
    }
    if (!needsLowering(module, capacityFactor))
      return;
    // A training program's experts (moe.experts_saved, or moe.experts
    // recomputed) and their gradients are lowered only where the experts
    // are distributed: on one rank the whole-stack ops keep their bits.
    const bool training = degreeOf(module, "ep") > 1 || degreeOf(module, "tp") > 1;
    SmallVector<Operation *> forwards;
    SmallVector<moe::ExpertsGradOp> grads;
    module.walk([&](Operation *op) {
      if (isa<moe::ExpertsOp>(op) || (training && isa<moe::ExpertsSavedOp>(op)))
        forwards.push_back(op);
      else if (auto grad = dyn_cast<moe::ExpertsGradOp>(op); grad && training)
        grads.push_back(grad);
    });
    // Each forward by its input and selection (what its gradient reads too).
    DenseMap<std::pair<Value, Value>, Lowered> lowered;
    for (Operation *op : forwards) {
      Lowered l;
      if (auto e = dyn_cast<moe::ExpertsOp>(op)) {
        l = lowerForward(op, maxTokens.getInt(), e.getInput(), e.getWeights(), e.getExperts(),
                         e.getGateWeights(), e.getUpWeights(), e.getDownWeights(),
                         e.getActivationAttr());
        lowered[{e.getInput(), e.getExperts()}] = l;
        continue;
      }
      auto s = cast<moe::ExpertsSavedOp>(op);
      l = lowerForward(op, maxTokens.getInt(), s.getInput(), s.getWeights(), s.getExperts(),
                       s.getGateWeights(), s.getUpWeights(), s.getDownWeights(),
                       s.getActivationAttr());
      lowered[{s.getInput(), s.getExperts()}] = l;
    }
    for (moe::ExpertsGradOp grad : grads) {
      auto it = lowered.find({grad.getInput(), grad.getExperts()});
      if (it == lowered.end()) {
        grad.emitOpError("moe-lower-routing: no moe.experts of the same input and selection "
                         "before it");
        return signalPassFailure();
      }
      lowerGradient(grad, it->second);
    }
    // The forwards go last: experts_saved's saved results were read by the
    // gradients just lowered.
    for (Operation *op : forwards) {
      if (!op->use_empty()) {
        op->emitOpError("moe-lower-routing: its saved activations are still read");
        return signalPassFailure();
      }
      op->erase();
    }
  }
};

} // namespace
