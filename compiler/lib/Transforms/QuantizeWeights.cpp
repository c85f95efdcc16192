//===- QuantizeWeights.cpp - mark weights for int8 -----------------*- C++ -*-===//
//
// moe-quantize-weights: which weights moert keeps as int8 (moec compile
// --weight-format int8). Only the matrices that linear layers and experts
// multiply: their kernels take int8 blocks; every other use of a weight
// (an embedding lookup, a router's logits, a norm) keeps it as stored.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLExtras.h"

namespace moe {
#define GEN_PASS_DEF_MOEQUANTIZEWEIGHTS
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

/// Whether `use` multiplies its weight as a linear layer's or an expert's
/// matrix (a router's logits excepted).
bool multipliesAsMatrix(OpOperand &use) {
  Operation *user = use.getOwner();
  if (auto linear = dyn_cast<moe::LinearOp>(user))
    return use.get() == linear.getWeight() &&
           llvm::none_of(linear->getUsers(), [](Operation *u) { return isa<moe::RouteOp>(u); });
  if (auto mlp = dyn_cast<moe::MLPOp>(user))
    return use.get() != mlp.getInput();
  if (auto experts = dyn_cast<moe::ExpertsOp>(user))
    return use.get() == experts.getGateWeights() || use.get() == experts.getUpWeights() ||
           use.get() == experts.getDownWeights();
  return false;
}

struct QuantizeWeightsPass : moe::impl::MoEQuantizeWeightsBase<QuantizeWeightsPass> {
  using MoEQuantizeWeightsBase::MoEQuantizeWeightsBase;
  void runOnOperation() override {
    if (format != "int8") {
      getOperation().emitError("moe-quantize-weights: format '")
          << static_cast<std::string>(format) << "': expected int8";
      return signalPassFailure();
    }
    if (block < 1 || block > 4096) {
      getOperation().emitError("moe-quantize-weights: block ")
          << static_cast<int64_t>(block) << ": expected 1 to 4096";
      return signalPassFailure();
    }
    Builder b(&getContext());
    WalkResult result = getOperation().walk([&](Operation *op) {
      if (!isa<moe::WeightOp, moe::ExpertWeightOp>(op) || op->getResult(0).use_empty())
        return WalkResult::advance();
      if (!llvm::all_of(op->getResult(0).getUses(), multipliesAsMatrix))
        return WalkResult::advance();
      if (op->hasAttr("moe.fp8_block")) {
        op->emitError("moe-quantize-weights: '")
            << cast<moe::WeightOpInterface>(op).getTensorName()
            << "' is stored as FP8 blocks: not supported yet: int8 weights from an FP8 checkpoint";
        return WalkResult::interrupt();
      }
      op->setAttr("moe.int8_block", b.getI64IntegerAttr(static_cast<int64_t>(block)));
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
