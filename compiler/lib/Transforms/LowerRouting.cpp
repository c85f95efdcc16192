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

/// Whether the module's layout needs the lowered form: expert or tensor
/// parallelism (moe.sharding), or a capacity limit.
bool needsLowering(ModuleOp module, double capacityFactor) {
  if (capacityFactor > 0)
    return true;
  auto sharding = module->getAttrOfType<DictionaryAttr>("moe.sharding");
  auto degree = [&](StringRef key) {
    auto a = sharding ? sharding.getAs<IntegerAttr>(key) : nullptr;
    return a ? a.getInt() : int64_t(1);
  };
  return degree("ep") > 1 || degree("tp") > 1;
}

struct LowerRoutingPass : moe::impl::MoELowerRoutingBase<LowerRoutingPass> {
  using MoELowerRoutingBase::MoELowerRoutingBase;

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
    SmallVector<moe::ExpertsOp> all;
    module.walk([&](moe::ExpertsOp op) { all.push_back(op); });
    for (moe::ExpertsOp op : all) {
      OpBuilder b(op);
      Location loc = op.getLoc();
      const int64_t numExperts = op.getGateWeights().getType().getDimSize(0);
      const int64_t k = op.getExperts().getType().getDimSize(1);
      auto inputType = cast<RankedTensorType>(op.getInput().getType());
      const int64_t capacity =
          moe::dispatchCapacity(capacityFactor, maxTokens.getInt(), k, numExperts);
      auto bufferType = RankedTensorType::get({numExperts, capacity, inputType.getDimSize(1)},
                                              inputType.getElementType());
      auto countsType = RankedTensorType::get({numExperts}, b.getI32Type());
      // One row part (moe-partition splits the rows of a TP group).
      auto dispatch = b.create<moe::DispatchOp>(
          loc, bufferType, countsType, op.getExperts().getType(), op.getInput(), op.getExperts(),
          b.getI64IntegerAttr(capacity), b.getF64FloatAttr(capacityFactor),
          b.getI64IntegerAttr(1), b.getI64IntegerAttr(1));
      Value out = b.create<moe::ExpertFFNOp>(loc, bufferType, dispatch.getBuffer(),
                                             dispatch.getCounts(), op.getGateWeights(),
                                             op.getUpWeights(), op.getDownWeights(),
                                             op.getActivationAttr());
      Value combined = b.create<moe::CombineOp>(loc, inputType, out, dispatch.getSlots(),
                                                op.getWeights());
      op.getResult().replaceAllUsesWith(combined);
      op.erase();
    }
  }
};

} // namespace
