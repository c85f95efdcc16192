//===- RecomputeLayers.cpp - whole layers recomputed --------------*- C++ -*-===//
//
// moe-recompute-layers (moec compile --train --recompute full): activation
// checkpointing per decoder layer. The forward values only their own layer
// reads are rematerialised in the backward pass, right before the first
// gradient op that reads them, from the values that cross layer boundaries
// (saved). The clones are the original ops on the same operands, so the
// gradients are bitwise those of saving everything. docs/training.md.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <limits>

namespace moe {
#define GEN_PASS_DEF_MOERECOMPUTELAYERS
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

constexpr int64_t kHead = -1, kTail = std::numeric_limits<int64_t>::max();

/// One train program's rematerialisation.
class Recompute {
public:
  Recompute(func::FuncOp fn, ArrayRef<int64_t> only) : fn(fn), only(only) {}

  LogicalResult run() {
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    Operation *lossOp = ret.getNumOperands() > 1 ? ret.getOperand(0).getDefiningOp() : nullptr;
    if (!lossOp || lossOp->getBlock() != &body)
      return fn.emitError("moe-recompute-layers: @")
             << fn.getSymName() << ": expected a differentiated train program (its loss, then "
             << "its gradients)";
    // The forward ops (up to the loss) and their layers.
    SmallVector<Operation *> backward;
    bool forward = true;
    int64_t attentions = 0;
    for (Operation &op : body.without_terminator()) {
      if (!forward) {
        backward.push_back(&op);
        continue;
      }
      forward = &op != lossOp;
      if (isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op))
        continue;
      segment[&op] = segmentOf(&op);
      if (isa<moe::AttentionOp, moe::MLAttentionOp>(op))
        attentionIndex[&op] = attentions++;
    }
    for (Operation *op : backward) {
      OpBuilder b(op);
      for (OpOperand &use : op->getOpOperands())
        if (recomputable(use.get()))
          use.set(rematerialise(b, use.get()));
    }
    return success();
  }

private:
  /// The layer of a forward op: that of the layer weights it reads, else
  /// the latest of its operands' (the embedding and what reads only the
  /// inputs: kHead; a weight outside the layers read after them: kTail).
  int64_t segmentOf(Operation *op) {
    int64_t at = kHead;
    bool outsideWeight = false;
    for (Value operand : op->getOperands()) {
      if (moe::WeightOpInterface w = moe::weightBehind(operand)) {
        if (std::optional<int64_t> layer = w.getDecoderLayer())
          at = std::max(at, *layer);
        else
          outsideWeight = true;
        continue;
      }
      if (Operation *def = operand.getDefiningOp()) {
        auto found = segment.find(def);
        if (found != segment.end())
          at = std::max(at, found->second);
      }
    }
    return outsideWeight && at != kHead ? kTail : at;
  }

  /// A forward value of a layer that only that layer's forward ops read,
  /// computed by an op without side effects.
  bool recomputable(Value v) {
    Operation *def = v.getDefiningOp();
    auto found = def ? segment.find(def) : segment.end();
    if (found == segment.end() || found->second == kHead || found->second == kTail ||
        !isMemoryEffectFree(def) || (!only.empty() && !llvm::is_contained(only, found->second)))
      return false;
    auto cached = crossing.find(v);
    if (cached != crossing.end())
      return !cached->second;
    bool crosses = false;
    for (Operation *user : v.getUsers()) {
      auto at = segment.find(user);
      crosses |= at != segment.end() && at->second != found->second;
    }
    crossing[v] = crosses;
    return !crosses;
  }

  /// `v` computed again at `b`'s point (once per value), from the saved
  /// values and the clones of its recomputable operands.
  Value rematerialise(OpBuilder &b, Value v) {
    auto found = clones.find(v);
    if (found != clones.end())
      return found->second;
    Operation *def = v.getDefiningOp();
    IRMapping map;
    for (Value operand : def->getOperands())
      if (recomputable(operand))
        map.map(operand, rematerialise(b, operand));
    Operation *clone = b.clone(*def, map);
    clone->setAttr("moe.recomputed", b.getUnitAttr());
    auto attention = attentionIndex.find(def);
    if (attention != attentionIndex.end())
      clone->setAttr("moe.recomputes_cache_of", b.getI64IntegerAttr(attention->second));
    for (auto [original, copy] : llvm::zip(def->getResults(), clone->getResults()))
      clones[original] = copy;
    return clones.lookup(v);
  }

  func::FuncOp fn;
  ArrayRef<int64_t> only; ///< the layers recomputed (empty: all)
  DenseMap<Operation *, int64_t> segment, attentionIndex;
  DenseMap<Value, bool> crossing;
  DenseMap<Value, Value> clones;
};

struct RecomputeLayers : moe::impl::MoERecomputeLayersBase<RecomputeLayers> {
  using MoERecomputeLayersBase::MoERecomputeLayersBase;
  void runOnOperation() override {
    for (auto fn : getOperation().getOps<func::FuncOp>()) {
      auto entry = fn->getAttrOfType<StringAttr>("moe.entry");
      if (!entry || entry.getValue() != "train")
        continue;
      // (A pipeline stage's backward function holds no forward ops to
      // clone: the pass runs on the whole program, before moe-partition.)
      if (moe::pipelineForwardOf(fn)) {
        fn.emitError("moe-recompute-layers: @")
            << fn.getSymName() << " is a pipeline stage's backward program: recompute "
            << "layers before moe-partition cuts the program into stages";
        return signalPassFailure();
      }
      if (failed(Recompute(fn, layers).run()))
        return signalPassFailure();
    }
  }
};

} // namespace
