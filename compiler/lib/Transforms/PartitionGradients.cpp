//===- PartitionGradients.cpp - moe-partition's training ops -----*- C++ -*-===//
//
// The loss and backward ops of a training program (moe-append-loss,
// moe-differentiate) on a rank (docs/training.md, "Tensor parallelism"):
// each gradient takes the distribution the transpose of its forward gives
// it, so that moe-insert-collectives places the backward's collectives as
// it places the forward's, where a user needs a value whole:
//   - a column-parallel linear (its weight's output rows split: attention's
//     projections, the gate/up halves of an MLP, the vocabulary-split LM
//     head) takes its output's gradient split and gives a partial input
//     gradient (the all_reduce Megatron calls the backward of f);
//   - a row-parallel linear takes its output's gradient whole (the
//     all_reduce of the forward's partial sums transposes to nothing) and
//     gives a split input gradient;
//   - attention and RoPE stay on the rank's heads; a norm of a split row
//     (Qwen3's per-head q_norm) gives a partial weight gradient;
//   - the cross-entropy is Megatron's vocabulary-parallel one: each rank's
//     statistics of its part of the logits gathered (moe.vocab_stats), its
//     gradient for the rank's part (moe.vocab_shard); the embedding's
//     gradient for the rank's rows of the table;
//   - the routed experts of a TP group's row parts give partial input and
//     routing-weight gradients (each rank its rows, with etp its slices of
//     the experts); the experts' own gradients are the rank's rows' sums,
//     which the optimizer program adds over edp.
// A weight's gradient is returned as the rank holds the weight: its part
// of a split weight, the group's sum of a partial one (all_reduce).
// Under expert parallelism the experts' backward exchanges its gradient
// blocks as the forward exchanged its blocks.
//
//===----------------------------------------------------------------------===//
#include "Partitioner.h"
#include "moe/Transforms/Passes.h"

#include "mlir/IR/IRMapping.h"

namespace moe::partition {

FailureOr<Value> Partitioner::operandAs(Value old, Operation *user, Dist want) {
  if (want == Dist::Replicated)
    return replicated(old, user);
  auto it = values.find(old);
  if (it == values.end())
    return user->emitOpError("operand is not available on this stage"), failure();
  if (want == Dist::Local && it->second.dist != Dist::Local)
    return user->emitOpError("expected a tensor-parallel split operand"), failure();
  return it->second.value;
}

/// The experts' backward on this rank's experts: the gradient blocks go to
/// the experts' ranks as the forward's blocks did, with them the forward's
/// received blocks (moe-insert-collectives pairs the two), and the blocks'
/// gradients come back.
LogicalResult Partitioner::expertFFNGrad(moe::ExpertFFNGradOp op) {
  FailureOr<Value> gate = weight(op.getGateWeights(), op);
  FailureOr<Value> up = weight(op.getUpWeights(), op);
  FailureOr<Value> down = weight(op.getDownWeights(), op);
  if (failed(gate) || failed(up) || failed(down))
    return failure();
  for (Value v : {op.getGrad(), op.getBuffer(), op.getCounts()})
    if (!values.count(v))
      return op.emitOpError("operand is not available on this stage");
  auto f32 = [&](Value stack) {
    auto t = cast<RankedTensorType>(stack.getType());
    return RankedTensorType::get(t.getShape(), b.getF32Type());
  };
  Value buffer = get(op.getBuffer()).value;
  auto grad = b.create<moe::ExpertFFNGradOp>(
      op.getLoc(), buffer.getType(), f32(*gate), f32(*up), f32(*down),
      get(op.getGrad()).value, buffer, get(op.getCounts()).value, *gate, *up, *down,
      op.getActivationAttr());
  if (d.ep > 1)
    grad->setAttr(moe::kExchangeAttr, group(expertsRef, kEpAxis));
  // The rank's sums of its experts' (slices') gradients over its rows: the
  // optimizer program adds those of every holder of the same slices (edp).
  // With etp the blocks' gradient is a partial sum of the slices'.
  set(op.getResult(0), grad.getResult(0), d.etp > 1 ? Dist::Partial : Dist::Replicated);
  for (unsigned i = 1; i < 4; ++i)
    set(op.getResult(i), grad.getResult(i), Dist::Replicated);
  return success();
}

Value Partitioner::gatheredVocabStats(Location loc, Value logits, Value labels,
                                      IntegerAttr vocab) {
  auto rows = cast<RankedTensorType>(logits.getType()).getDimSize(0);
  auto part = b.create<moe::VocabStatsOp>(loc, RankedTensorType::get({rows, 4}, b.getF32Type()),
                                          logits, labels, vocab);
  part->setAttr("moe.vocab_shard", b.getUnitAttr());
  auto whole = b.create<UnrealizedConversionCastOp>(
      loc, RankedTensorType::get({rows, 4 * d.tp}, b.getF32Type()), part.getResult());
  whole->setAttr(moe::kGatherAttr, group(meshRef, kTpAxis));
  return whole.getResult(0);
}

LogicalResult Partitioner::rewriteTraining(Operation &op, bool &handled) {
  handled = isa<moe::CrossEntropyOp, moe::RouterStatsOp, moe::LMLossOp, moe::ExpertsSavedOp,
                moe::CrossEntropyGradOp, moe::LinearGradOp, moe::BiasGradOp,
                moe::RMSNormGradOp, moe::RopeGradOp, moe::AttentionGradOp,
                moe::MLAttentionGradOp, moe::MLPGradOp, moe::EmbeddingGradOp, moe::RouteGradOp,
                moe::ExpertsGradOp, moe::RouterStatsGradOp, moe::SigmoidGateGradOp,
                moe::CombineGradOp, moe::DispatchGradOp, moe::ExpertFFNGradOp>(op);
  if (!handled)
    return success();
  auto fail = [&](const Twine &message) { return op.emitOpError(message), failure(); };
  if (auto grad = dyn_cast<moe::ExpertFFNGradOp>(op))
    return expertFFNGrad(grad);

  // Operands as each rule wants them (weights: the rank's parts), the op
  // cloned with them, its results typed and placed.
  IRMapping mapping;
  auto map = [&](Value old, Dist want) -> LogicalResult {
    if (weightOpOf(old)) {
      FailureOr<Value> w = weight(old, &op);
      if (failed(w))
        return failure();
      mapping.map(old, *w);
      return success();
    }
    FailureOr<Value> v = operandAs(old, &op, want);
    if (failed(v))
      return failure();
    mapping.map(old, *v);
    return success();
  };
  auto mapAll = [&](Dist want) -> LogicalResult {
    for (Value operand : op.getOperands())
      if (failed(map(operand, want)))
        return failure();
    return success();
  };
  auto distOf = [&](Value old) { return get(old).dist; };
  auto typeOf = [&](Value old) { return mapping.lookup(old).getType(); };
  auto f32Of = [&](Value old) {
    auto t = cast<RankedTensorType>(typeOf(old));
    return RankedTensorType::get(t.getShape(), b.getF32Type());
  };
  // Clone with results of `types` (null: the old type) placed as `dists`.
  auto emit = [&](ArrayRef<Type> types, ArrayRef<Dist> dists) {
    Operation *copy = b.clone(op, mapping);
    for (auto [i, result] : llvm::enumerate(copy->getResults())) {
      if (i < types.size() && types[i])
        result.setType(types[i]);
      set(op.getResult(i), result, dists[i]);
    }
    return copy;
  };
  const bool tp = d.tp > 1;

  if (auto g = dyn_cast<moe::LinearGradOp>(op)) {
    Operation *w = weightOpOf(g.getWeight());
    if (!w)
      return fail("expected a weight operand");
    if (failed(map(g.getWeight(), Dist::Replicated)))
      return failure();
    auto local = cast<RankedTensorType>(typeOf(g.getWeight()));
    auto global = g.getWeight().getType();
    const bool rowParallel = local.getDimSize(1) != global.getDimSize(1);
    const bool columnParallel = local.getDimSize(0) != global.getDimSize(0) ||
                                isVocabSharded(g.getWeight());
    if (rowParallel) { // dy whole, x split: dx split
      if (failed(map(g.getGrad(), Dist::Replicated)) || failed(map(g.getInput(), Dist::Local)))
        return failure();
      emit({typeOf(g.getInput()), f32Of(g.getWeight())}, {Dist::Local, Dist::Local});
      return success();
    }
    if (columnParallel) { // dy split, x whole: dx partial
      if (failed(map(g.getGrad(), Dist::Local)) || failed(map(g.getInput(), Dist::Replicated)))
        return failure();
      emit({Type(), f32Of(g.getWeight())}, {Dist::Partial, Dist::Local});
      return success();
    }
    if (failed(mapAll(Dist::Replicated)))
      return failure();
    emit({}, {Dist::Replicated, Dist::Replicated});
    return success();
  }
  if (auto g = dyn_cast<moe::RMSNormGradOp>(op)) {
    // A norm of whole rows that TP splits (OLMoE's q_norm / k_norm): the
    // rank's row sums over its part, added over tp, stand for the row's;
    // the weight's gradient is its part's.
    const int64_t rowWidth = cast<RankedTensorType>(g.getInput().getType()).getDimSize(1);
    if (distOf(g.getInput()) == Dist::Local &&
        cast<RankedTensorType>(g.getWeight().getType()).getDimSize(0) == rowWidth) {
      if (g.getRowStats())
        return fail("expected the gradient of a norm of whole rows before moe-partition");
      if (failed(map(g.getGrad(), Dist::Local)) || failed(map(g.getInput(), Dist::Local)) ||
          failed(map(g.getWeight(), Dist::Replicated)))
        return failure();
      Value dy = mapping.lookup(g.getGrad()), x = mapping.lookup(g.getInput()),
            w = mapping.lookup(g.getWeight());
      auto statsType = RankedTensorType::get(
          {cast<RankedTensorType>(x.getType()).getDimSize(0), 2}, b.getF32Type());
      Value stats = b.create<moe::RMSNormGradStatsOp>(op.getLoc(), statsType, dy, x, w);
      auto grad = b.create<moe::RMSNormGradOp>(
          op.getLoc(), x.getType(), f32Of(g.getWeight()), dy, x, w, wholeOfPartial(stats),
          g.getEpsilonAttr(), b.getI64IntegerAttr(rowWidth));
      set(g.getInputGrad(), grad.getInputGrad(), Dist::Local);
      set(g.getWeightGrad(), grad.getWeightGrad(), Dist::Local);
      return success();
    }
    if (distOf(g.getInput()) == Dist::Local) { // a norm of each head's part
      if (failed(map(g.getGrad(), Dist::Local)) || failed(map(g.getInput(), Dist::Local)) ||
          failed(map(g.getWeight(), Dist::Replicated)))
        return failure();
      emit({typeOf(g.getInput())}, {Dist::Local, Dist::Partial});
      return success();
    }
    if (failed(mapAll(Dist::Replicated)))
      return failure();
    emit({}, {Dist::Replicated, Dist::Replicated});
    return success();
  }
  if (auto g = dyn_cast<moe::RopeGradOp>(op)) {
    const Dist dist = distOf(g.getGrad());
    if (dist == Dist::Partial)
      return fail("rotates a partial sum");
    if (failed(map(g.getGrad(), Dist::Partial)) || failed(map(g.getPositions(), Dist::Replicated)))
      return failure();
    emit({typeOf(g.getGrad())}, {dist});
    return success();
  }
  if (auto g = dyn_cast<moe::AttentionGradOp>(op)) {
    const Dist want = tp ? Dist::Local : Dist::Replicated;
    for (Value v : op.getOperands())
      if (failed(map(v, v == g.getGrad() || v == g.getQuery() || v == g.getKey() ||
                                v == g.getValue()
                            ? want
                            : Dist::Replicated)))
        return failure();
    auto copy = cast<moe::AttentionGradOp>(
        emit({typeOf(g.getQuery()), typeOf(g.getKey()), typeOf(g.getValue())},
             {want, want, want}));
    copy.setNumHeads(g.getNumHeads() / d.tp);
    copy.setNumKvHeads(g.getNumKvHeads() / d.tp);
    return success();
  }
  if (auto g = dyn_cast<moe::MLAttentionGradOp>(op)) {
    const Dist want = tp ? Dist::Local : Dist::Replicated;
    for (Value v : op.getOperands())
      if (failed(map(v, v == g.getGrad() || v == g.getQuery() || v == g.getKv()
                            ? want
                            : Dist::Replicated)))
        return failure();
    // (The shared rotary key's gradient: the rank's heads' sum.)
    auto copy = cast<moe::MLAttentionGradOp>(
        emit({typeOf(g.getQuery()), typeOf(g.getKv()), Type()},
             {want, want, tp ? Dist::Partial : Dist::Replicated}));
    copy.setNumHeads(g.getNumHeads() / d.tp);
    return success();
  }
  if (isa<moe::MLPGradOp>(op)) { // a dense MLP split by its intermediate
    if (failed(mapAll(Dist::Replicated)))
      return failure();
    SmallVector<Type> types{Type()};
    for (Value w : op.getOperands().drop_front(2))
      types.push_back(f32Of(w));
    emit(types, {tp ? Dist::Partial : Dist::Replicated, Dist::Local, Dist::Local, Dist::Local});
    return success();
  }
  if (auto g = dyn_cast<moe::EmbeddingGradOp>(op)) {
    if (failed(mapAll(Dist::Replicated)))
      return failure();
    if (!vocabShardedTable) {
      emit({}, {Dist::Replicated});
      return success();
    }
    // The rank's rows of the padded vocabulary.
    auto t = g.getResult().getType();
    Operation *copy = emit({withDim(t, 0, paddedVocab / d.tp)}, {Dist::Local});
    copy->setAttr("moe.vocab_shard", b.getUnitAttr());
    return success();
  }
  if (auto ce = dyn_cast<moe::CrossEntropyOp>(op); ce && distOf(ce.getLogits()) == Dist::Local) {
    // Megatron's vocabulary-parallel cross-entropy: each rank's statistics
    // of its part of the logits, gathered ([T, 4 tp]: no logits move), give
    // every rank the whole cross-entropy.
    FailureOr<Value> logits = operandAs(ce.getLogits(), &op, Dist::Local);
    FailureOr<Value> labels = operandAs(ce.getLabels(), &op, Dist::Replicated);
    if (failed(logits) || failed(labels))
      return failure();
    Value whole = gatheredVocabStats(op.getLoc(), *logits, *labels, ce.getVocabAttr());
    vocabStats[ce.getLogits()] = whole;
    auto result = b.create<moe::CrossEntropyOfStatsOp>(op.getLoc(), ce.getType(), whole,
                                                       *labels, ce.getVocabAttr());
    set(ce.getResult(), result.getResult(), Dist::Replicated);
    return success();
  }
  if (auto g = dyn_cast<moe::CrossEntropyGradOp>(op)) {
    if (distOf(g.getLogits()) != Dist::Local) {
      if (failed(mapAll(Dist::Replicated)))
        return failure();
      emit({}, {Dist::Replicated});
      return success();
    }
    // The rank's part of the padded vocabulary (the vocabulary-split LM
    // head's output gradient), from its logits and the gathered statistics.
    Value stats = vocabStats.lookup(g.getLogits());
    FailureOr<Value> logits = operandAs(g.getLogits(), &op, Dist::Local);
    FailureOr<Value> labels = operandAs(g.getLabels(), &op, Dist::Replicated);
    FailureOr<Value> ce = operandAs(g.getCrossEntropy(), &op, Dist::Replicated);
    if (failed(logits) || failed(labels) || failed(ce))
      return failure();
    // (A pipeline stage's backward program gathers them again from the
    // logits its forward program kept: the same values.)
    if (stats && stats.getParentRegion() != entry->getParent())
      stats = gatheredVocabStats(op.getLoc(), *logits, *labels, g.getVocabAttr());
    if (!stats)
      return fail("expected the vocabulary-parallel cross-entropy of the same logits before it");
    auto local = cast<RankedTensorType>(logits->getType());
    auto grad = b.create<moe::CrossEntropyGradOp>(
        op.getLoc(), RankedTensorType::get(local.getShape(), b.getF32Type()), *logits,
                                                  *labels, *ce, stats, g.getVocabAttr());
    grad->setAttr("moe.vocab_shard", b.getUnitAttr());
    set(g.getResult(), grad.getResult(), Dist::Local);
    return success();
  }
  if (auto g = dyn_cast<moe::SigmoidGateGradOp>(op)) {
    // x * sigmoid(g) with x partial (a shared expert's split output): dx
    // whole, dgate the group's sum of each part's.
    const Dist dx = distOf(g.getInput());
    if (dx == Dist::Local)
      return fail("gates a tensor-parallel split value");
    if (failed(map(g.getGrad(), Dist::Replicated)) || failed(map(g.getInput(), Dist::Partial)) ||
        failed(map(g.getGate(), Dist::Replicated)))
      return failure();
    emit({}, {Dist::Replicated, dx});
    return success();
  }
  if (auto g = dyn_cast<moe::BiasGradOp>(op)) {
    if (distOf(g.getGrad()) == Dist::Local) { // a column-parallel layer's bias
      if (failed(map(g.getGrad(), Dist::Local)))
        return failure();
      auto dy = cast<RankedTensorType>(typeOf(g.getGrad()));
      emit({RankedTensorType::get({dy.getDimSize(1)}, b.getF32Type())}, {Dist::Local});
      return success();
    }
    if (failed(mapAll(Dist::Replicated)))
      return failure();
    emit({}, {Dist::Replicated});
    return success();
  }
  if (auto g = dyn_cast<moe::CombineGradOp>(op)) {
    // The rank's blocks (its row part's under TP): their gradient, and the
    // routing weights' of its rows (0 elsewhere: partial).
    if (failed(map(g.getGrad(), Dist::Replicated)) ||
        failed(map(g.getOutputs(), Dist::Partial)) || failed(map(g.getSlots(), Dist::Partial)) ||
        failed(map(g.getWeights(), Dist::Replicated)))
      return failure();
    emit({}, {Dist::Replicated, tp ? Dist::Partial : Dist::Replicated});
    return success();
  }
  if (auto g = dyn_cast<moe::DispatchGradOp>(op)) {
    if (failed(map(g.getGrad(), Dist::Partial)) || failed(map(g.getSlots(), Dist::Partial)))
      return failure();
    emit({}, {tp ? Dist::Partial : Dist::Replicated});
    return success();
  }
  // The loss, the routing's and the fused experts' gradients (one rank or
  // data-parallel replicas: the experts are lowered under EP and TP): on
  // whole values.
  if (isa<moe::ExpertsSavedOp, moe::ExpertsGradOp>(op) && (d.ep > 1 || tp))
    return fail("needs moe-lower-routing first: routed experts under expert or tensor "
                "parallelism run as dispatch / expert_ffn / combine");
  if (failed(mapAll(Dist::Replicated)))
    return failure();
  SmallVector<Dist> dists(op.getNumResults(), Dist::Replicated);
  emit({}, dists);
  return success();
}

} // namespace moe::partition
