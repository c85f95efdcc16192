//===- FuseAddNorm.cpp - moe.add + norm -> moe.add_norm ----------*- C++ -*-===//
//
// moe-fuse-add-norm: the residual add fused with the norm that reads its sum
// (a decoder layer's post-attention norm, the next layer's input norm, the
// final norm). Both backends then read each residual row once: the CUDA
// target emits one kernel, the CPU one step. It runs after partitioning
// (which needs the plain add to place its all_reduce) and before buffers are
// assigned (a sum nothing else reads needs no buffer of its own).
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SmallVector.h"

namespace moe {
#define GEN_PASS_DEF_MOEFUSEADDNORM
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

/// The norm that reads `add`'s sum before anything else does, in the
/// add's block; null when the first reader is not a norm.
Operation *firstReaderNorm(moe::AddOp add) {
  Operation *first = nullptr;
  for (Operation *user : add.getResult().getUsers()) {
    if (user->getBlock() != add->getBlock())
      return nullptr;
    if (!first || user->isBeforeInBlock(first))
      first = user;
  }
  // (Not a norm of rows tensor parallelism splits: add_norm has no
  // sum_squares.)
  if (auto rms = dyn_cast_or_null<moe::RMSNormOp>(first); rms && rms.getSumSquares())
    return nullptr;
  if (first && isa<moe::RMSNormOp, moe::LayerNormOp>(first))
    return first;
  return nullptr;
}

struct FuseAddNormPass : moe::impl::MoEFuseAddNormBase<FuseAddNormPass> {
  void runOnOperation() override {
    llvm::SmallVector<moe::AddOp> adds;
    getOperation().walk([&](moe::AddOp add) { adds.push_back(add); });
    for (moe::AddOp add : adds) {
      Operation *norm = firstReaderNorm(add);
      if (!norm)
        continue;
      // The fused op takes the norm's place: its weights are defined by
      // then, and nothing between the add and the norm reads the sum.
      OpBuilder b(norm);
      Type type = add.getType();
      moe::AddNormOp fused;
      if (auto rms = dyn_cast<moe::RMSNormOp>(norm))
        fused = b.create<moe::AddNormOp>(norm->getLoc(), type, type, add.getLhs(), add.getRhs(),
                                         rms.getWeight(), Value(), rms.getEpsilonAttr(),
                                         /*layer=*/UnitAttr());
      else {
        auto layer = cast<moe::LayerNormOp>(norm);
        fused = b.create<moe::AddNormOp>(norm->getLoc(), type, type, add.getLhs(), add.getRhs(),
                                         layer.getWeight(), layer.getBias(),
                                         layer.getEpsilonAttr(), b.getUnitAttr());
      }
      // (A layer recomputed in the backward pass stays marked so.)
      if (norm->hasAttr("moe.recomputed"))
        fused->setAttr("moe.recomputed", b.getUnitAttr());
      norm->getResult(0).replaceAllUsesWith(fused.getResult());
      norm->erase();
      add.getResult().replaceAllUsesWith(fused.getSum());
      add.erase();
    }
  }
};

} // namespace
