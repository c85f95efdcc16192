//===- InsertCollectives.cpp - reshardings to collectives --------*- C++ -*-===//
//
// moe-insert-collectives: moe-partition places every value (whole, a
// tensor-parallel part, a partial sum) and, where a user needs a partial sum
// whole, says so with a pair of annotations:
//
//   %p = mesh.shard %v to <@mesh, [[]], partial = sum[2]>
//   %w = mesh.shard %p to <@mesh, [[]]> annotate_for_users
//
// This pass decides how each such resharding is communicated: a partial sum
// over mesh axes becomes one moe.all_reduce per axis (where a later choice,
// reduce_scatter + all_gather for sequence parallelism, belongs). Any other
// resharding between two annotations is refused, naming it.
//
// An moe.expert_ffn that moe-partition marks with `moe.exchange = {mesh =
// @experts, axis = 2}` gets its blocks from the ranks of that group and
// gives the outputs back: an moe.all_to_all of the blocks and their counts
// before it, and one of the outputs (with the received counts) after it.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"

namespace moe {
#define GEN_PASS_DEF_MOEINSERTCOLLECTIVES
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

bool isWhole(mesh::MeshShardingAttr s) {
  return llvm::all_of(s.getSplitAxes(), [](mesh::MeshAxesAttr a) { return a.empty(); });
}

} // namespace

bool moe::awaitsCollective(Operation *op) {
  if (op->hasAttr(kExchangeAttr))
    return true;
  auto shard = dyn_cast<mesh::ShardOp>(op);
  return shard && (shard.getAnnotateForUsers() || !shard.getShard().getPartialAxes().empty());
}

namespace {

/// The all_to_alls around an expert_ffn marked with moe.exchange.
LogicalResult exchange(moe::ExpertFFNOp op) {
  auto group = op->getAttrOfType<DictionaryAttr>(moe::kExchangeAttr);
  auto mesh = group ? group.getAs<FlatSymbolRefAttr>("mesh") : nullptr;
  auto axis = group ? group.getAs<IntegerAttr>("axis") : nullptr;
  if (!mesh || !axis)
    return op.emitOpError("moe-insert-collectives: ")
           << moe::kExchangeAttr << " must be {mesh = @symbol, axis = integer}";
  OpBuilder b(op);
  auto there = b.create<moe::AllToAllOp>(op.getLoc(), op.getBuffer().getType(),
                                         op.getCounts().getType(), op.getBuffer(),
                                         op.getCounts(), mesh, axis);
  op.getBufferMutable().assign(there.getResult());
  op.getCountsMutable().assign(there.getResultCounts());
  b.setInsertionPointAfter(op);
  auto back = b.create<moe::AllToAllOp>(op.getLoc(), op.getResult().getType(),
                                        op.getCounts().getType(), op.getResult(),
                                        there.getResultCounts(), mesh, axis);
  op.getResult().replaceAllUsesExcept(back.getResult(), back);
  op->removeAttr(moe::kExchangeAttr);
  return success();
}

struct InsertCollectives : moe::impl::MoEInsertCollectivesBase<InsertCollectives> {
  void runOnOperation() override {
    SmallVector<moe::ExpertFFNOp> exchanges;
    getOperation().walk([&](moe::ExpertFFNOp op) {
      if (op->hasAttr(moe::kExchangeAttr))
        exchanges.push_back(op);
    });
    for (moe::ExpertFFNOp op : exchanges)
      if (failed(exchange(op)))
        return signalPassFailure();
    SmallVector<mesh::ShardOp> uses;
    getOperation().walk([&](mesh::ShardOp op) {
      if (op.getAnnotateForUsers() && op.getSrc().getDefiningOp<mesh::ShardOp>())
        uses.push_back(op);
    });
    for (mesh::ShardOp use : uses) {
      auto def = use.getSrc().getDefiningOp<mesh::ShardOp>();
      mesh::MeshShardingAttr from = def.getShard(), to = use.getShard();
      if (def.getAnnotateForUsers() || from.getPartialAxes().empty() || !isWhole(from) ||
          !isWhole(to) || !to.getPartialAxes().empty() || from.getMesh() != to.getMesh()) {
        use.emitError("moe-insert-collectives: no collective for resharding ")
            << from << " to " << to << " (only a partial sum to a whole value)";
        return signalPassFailure();
      }
      if (from.getPartialType() != mesh::ReductionKind::Sum) {
        use.emitError("moe-insert-collectives: a partial ")
            << mesh::stringifyReductionKind(from.getPartialType())
            << " is not supported yet (only sums)";
        return signalPassFailure();
      }
      OpBuilder b(use);
      Value v = def.getSrc();
      for (mesh::MeshAxis axis : from.getPartialAxes())
        v = b.create<moe::AllReduceOp>(use.getLoc(), v, from.getMesh(),
                                       b.getI64IntegerAttr(axis));
      use.replaceAllUsesWith(v);
      use.erase();
      if (def->use_empty())
        def.erase();
    }
  }
};

} // namespace
