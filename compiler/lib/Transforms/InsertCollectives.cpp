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
// Its gradient, a marked moe.expert_ffn_grad of the same blocks, gets the
// gradient blocks the same way, reads the blocks the forward received, and
// gives their gradients back.
//
// A value's part made whole (the LM head's vocabulary parts):
//
//   %w = builtin.unrealized_conversion_cast %part : tensor<?x128xf32> to
//        tensor<?x251xf32> {moe.gather = {mesh = @mesh, axis = 2}}
//
// becomes an moe.all_gather of the group's parts along the last dimension
// and, where they hold more columns than the whole (padding), a split.
//
// A stage function's arguments marked `moe.recv_from = s` are received from
// stage s at its entry (moe.recv, in order) and its results marked
// `moe.send_to = s` are sent there before it returns (moe.send, in order).
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/BitVector.h"

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

namespace {

bool hasStageTransfers(func::FuncOp fn) {
  for (unsigned i = 0; i < fn.getNumArguments(); ++i)
    if (fn.getArgAttr(i, moe::kRecvFromAttr))
      return true;
  for (unsigned i = 0; i < fn.getNumResults(); ++i)
    if (fn.getResultAttr(i, moe::kSendToAttr))
      return true;
  return false;
}

} // namespace

bool moe::awaitsCollective(Operation *op) {
  if (op->hasAttr(kExchangeAttr) || op->hasAttr(kGatherAttr))
    return true;
  if (auto fn = dyn_cast<func::FuncOp>(op))
    return hasStageTransfers(fn);
  auto shard = dyn_cast<mesh::ShardOp>(op);
  return shard && (shard.getAnnotateForUsers() || !shard.getShard().getPartialAxes().empty());
}

namespace {

/// The group a mark names: {mesh = @symbol, axis = integer}.
FailureOr<std::pair<FlatSymbolRefAttr, IntegerAttr>> groupOf(Operation *op, StringRef mark) {
  auto group = op->getAttrOfType<DictionaryAttr>(mark);
  auto mesh = group ? group.getAs<FlatSymbolRefAttr>("mesh") : nullptr;
  auto axis = group ? group.getAs<IntegerAttr>("axis") : nullptr;
  if (!mesh || !axis)
    return op->emitOpError("moe-insert-collectives: ")
               << mark << " must be {mesh = @symbol, axis = integer}",
           failure();
  return std::make_pair(mesh, axis);
}

/// The all_to_alls around an expert_ffn marked with moe.exchange.
LogicalResult exchange(moe::ExpertFFNOp op) {
  auto group = groupOf(op, moe::kExchangeAttr);
  if (failed(group))
    return failure();
  auto [mesh, axis] = *group;
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

/// The exchanges of an expert_ffn_grad marked with moe.exchange: its
/// gradient blocks go where the forward's blocks went (an all_to_all with
/// the dispatch's counts), it reads the blocks the forward's expert_ffn
/// received (the all_to_all of the same buffer, placed by exchange()), and
/// the blocks' gradients come back with the received counts.
LogicalResult exchangeGrad(moe::ExpertFFNGradOp op) {
  auto group = groupOf(op, moe::kExchangeAttr);
  if (failed(group))
    return failure();
  auto [mesh, axis] = *group;
  moe::AllToAllOp received;
  for (Operation *user : op.getBuffer().getUsers())
    if (auto a2a = dyn_cast<moe::AllToAllOp>(user);
        a2a && a2a.getBuffer() == op.getBuffer() && a2a.getMesh() == mesh.getValue() &&
        a2a.getAxis() == axis.getInt())
      received = a2a;
  // A pipeline stage's backward program keeps the forward's blocks as they
  // were dispatched (its arguments): they are exchanged again here, the
  // same rows to the same ranks.
  if (!received && isa<BlockArgument>(op.getBuffer()) && isa<BlockArgument>(op.getCounts())) {
    OpBuilder b(op);
    received = b.create<moe::AllToAllOp>(op.getLoc(), op.getBuffer().getType(),
                                         op.getCounts().getType(), op.getBuffer(),
                                         op.getCounts(), mesh, axis);
  }
  if (!received || received.getCounts() != op.getCounts())
    return op.emitOpError("moe-insert-collectives: expected the forward's exchange of its "
                          "blocks (an moe.expert_ffn of the same buffer and counts, marked "
                          "with moe.exchange over the same group)"),
           failure();
  OpBuilder b(op);
  auto there = b.create<moe::AllToAllOp>(op.getLoc(), op.getGrad().getType(),
                                         op.getCounts().getType(), op.getGrad(),
                                         op.getCounts(), mesh, axis);
  op.getGradMutable().assign(there.getResult());
  op.getBufferMutable().assign(received.getResult());
  op.getCountsMutable().assign(received.getResultCounts());
  b.setInsertionPointAfter(op);
  auto back = b.create<moe::AllToAllOp>(op.getLoc(), op.getBufferGrad().getType(),
                                        op.getCounts().getType(), op.getBufferGrad(),
                                        received.getResultCounts(), mesh, axis);
  op.getBufferGrad().replaceAllUsesExcept(back.getResult(), back);
  op->removeAttr(moe::kExchangeAttr);
  return success();
}

/// The all_gather (and the split that drops padding) of a cast marked with
/// moe.gather: the group's parts side by side along the last dimension.
LogicalResult gather(UnrealizedConversionCastOp cast) {
  auto group = groupOf(cast, moe::kGatherAttr);
  if (failed(group))
    return failure();
  auto [meshRef, axis] = *group;
  auto part = cast.getNumOperands() == 1
                  ? dyn_cast<RankedTensorType>(cast.getOperand(0).getType())
                  : nullptr;
  auto whole = cast.getNumResults() == 1 ? dyn_cast<RankedTensorType>(cast.getType(0)) : nullptr;
  if (!part || !whole || part.getRank() != 2 || whole.getRank() != 2 ||
      part.getElementType() != whole.getElementType() || part.isDynamicDim(1) ||
      whole.isDynamicDim(1))
    return cast.emitOpError("moe-insert-collectives: ")
           << moe::kGatherAttr << " expects one [rows, columns] part and its whole";
  auto mesh = SymbolTable::lookupNearestSymbolFrom<mesh::MeshOp>(cast, meshRef);
  if (!mesh || axis.getInt() < 0 || axis.getInt() >= mesh.getRank() ||
      ShapedType::isDynamic(mesh.getShape()[axis.getInt()]))
    return cast.emitOpError("moe-insert-collectives: ")
           << moe::kGatherAttr << " names no static axis " << axis.getInt() << " of " << meshRef;
  const int64_t columns = part.getDimSize(1) * mesh.getShape()[axis.getInt()];
  if (columns < whole.getDimSize(1))
    return cast.emitOpError("moe-insert-collectives: ")
           << moe::kGatherAttr << " of " << mesh.getShape()[axis.getInt()] << " parts of "
           << part.getDimSize(1) << " columns cannot make " << whole.getDimSize(1);
  OpBuilder b(cast);
  auto gathered = RankedTensorType::get({part.getDimSize(0), columns}, part.getElementType());
  Value all = b.create<moe::AllGatherOp>(cast.getLoc(), gathered, cast.getOperand(0), meshRef,
                                         axis);
  if (columns != whole.getDimSize(1)) {
    auto padding = RankedTensorType::get({part.getDimSize(0), columns - whole.getDimSize(1)},
                                         part.getElementType());
    all = b.create<moe::SplitOp>(cast.getLoc(), TypeRange{whole, padding}, all).getResult(0);
  }
  cast.getResult(0).replaceAllUsesWith(all);
  cast.erase();
  return success();
}

/// moe.recv of the arguments marked moe.recv_from (after the weights),
/// moe.send of the results marked moe.send_to; both leave the signature.
LogicalResult transfer(func::FuncOp fn) {
  auto stageOf = [&](Attribute mark, StringRef name) -> FailureOr<IntegerAttr> {
    auto stage = dyn_cast_or_null<IntegerAttr>(mark);
    if (!stage || !stage.getType().isInteger(64) || stage.getInt() < 0)
      return fn.emitOpError("moe-insert-collectives: ")
                 << name << " must be a stage (a non-negative i64)",
             failure();
    return stage;
  };
  Block &entry = fn.getBody().front();
  auto ret = dyn_cast<func::ReturnOp>(entry.getTerminator());
  if (fn.getBody().getBlocks().size() != 1 || !ret)
    return fn.emitOpError("moe-insert-collectives: a stage program is one block ending "
                          "in func.return");
  OpBuilder b = OpBuilder::atBlockBegin(&entry);
  while (isa<moe::WeightOpInterface>(*b.getInsertionPoint()))
    b.setInsertionPointAfter(&*b.getInsertionPoint());
  llvm::BitVector received(fn.getNumArguments());
  for (unsigned i = 0; i < fn.getNumArguments(); ++i)
    if (Attribute mark = fn.getArgAttr(i, moe::kRecvFromAttr)) {
      FailureOr<IntegerAttr> from = stageOf(mark, moe::kRecvFromAttr);
      if (failed(from))
        return failure();
      BlockArgument arg = entry.getArgument(i);
      arg.replaceAllUsesWith(b.create<moe::RecvOp>(arg.getLoc(), arg.getType(), *from));
      received.set(i);
    }
  b.setInsertionPoint(ret);
  llvm::BitVector sent(fn.getNumResults());
  for (unsigned i = 0; i < fn.getNumResults(); ++i)
    if (Attribute mark = fn.getResultAttr(i, moe::kSendToAttr)) {
      FailureOr<IntegerAttr> to = stageOf(mark, moe::kSendToAttr);
      if (failed(to))
        return failure();
      b.create<moe::SendOp>(ret.getLoc(), ret.getOperand(i), *to);
      sent.set(i);
    }
  fn.eraseArguments(received);
  ret->eraseOperands(sent);
  fn.eraseResults(sent);
  return success();
}

struct InsertCollectives : moe::impl::MoEInsertCollectivesBase<InsertCollectives> {
  void runOnOperation() override {
    for (auto fn : getOperation().getOps<func::FuncOp>())
      if (!fn.isExternal() && hasStageTransfers(fn) && failed(transfer(fn)))
        return signalPassFailure();
    SmallVector<UnrealizedConversionCastOp> gathers;
    getOperation().walk([&](UnrealizedConversionCastOp op) {
      if (op->hasAttr(moe::kGatherAttr))
        gathers.push_back(op);
    });
    for (UnrealizedConversionCastOp op : gathers)
      if (failed(gather(op)))
        return signalPassFailure();
    SmallVector<moe::ExpertFFNOp> exchanges;
    getOperation().walk([&](moe::ExpertFFNOp op) {
      if (op->hasAttr(moe::kExchangeAttr))
        exchanges.push_back(op);
    });
    for (moe::ExpertFFNOp op : exchanges)
      if (failed(exchange(op)))
        return signalPassFailure();
    // (After the forward's: a gradient's exchange reads the blocks those
    // received.)
    SmallVector<moe::ExpertFFNGradOp> gradExchanges;
    getOperation().walk([&](moe::ExpertFFNGradOp op) {
      if (op->hasAttr(moe::kExchangeAttr))
        gradExchanges.push_back(op);
    });
    for (moe::ExpertFFNGradOp op : gradExchanges)
      if (failed(exchangeGrad(op)))
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
