//===- Partition.cpp - one program per pipeline stage ------------*- C++ -*-===//
//
// Rewrites the sharded @forward (moe-plan-sharding's annotations) into
// @stage0 .. @stage<pp-1>: each keeps its stage's ops with rank-local shapes
// and marks the communication its sharding needs, which
// moe-insert-collectives places (docs/partitioned-execution.md): partial sums
// a user needs whole, the LM head's vocabulary parts (moe.gather), the
// experts' exchange (moe.exchange), the values crossing a stage cut (the
// stage functions' arguments and results, moe.recv_from / moe.send_to).
//
// Every value of the rewritten program carries a distribution:
//   Replicated  the same on every rank of the TP group;
//   Local       split along its last dimension over TP (column-parallel
//               outputs, attention heads);
//   Partial     a partial sum over the TP group (row-parallel outputs, the
//               vocabulary-sharded embedding, routed experts under TP).
// A use that needs a replicated value gets an all_reduce, marked at the
// first such use and shared by later ones: a shared expert's and the routed
// experts' partial sums meet in one add and take one all_reduce. A training
// program's loss and backward ops have their rules in PartitionGradients.cpp.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"
#include "Partitioner.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"

#include <cmath>
#include <optional>

namespace moe {
#define GEN_PASS_DEF_MOEPARTITION
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace moe::partition {

LogicalResult Partitioner::readSharding() {
  auto sharding = module->getAttrOfType<DictionaryAttr>("moe.sharding");
  auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
  auto vocabAttr = module->getAttrOfType<IntegerAttr>("moe.vocab_size");
  if (!sharding || !workload || !vocabAttr)
    return module.emitError("expected moe.sharding (moe-plan-sharding), "
                            "moe.workload (moe-specialize-workload) and "
                            "moe.vocab_size before partitioning");
  auto get = [&](DictionaryAttr dict, StringRef key) {
    auto a = dict.getAs<IntegerAttr>(key);
    return a ? a.getInt() : int64_t(1);
  };
  d = {get(sharding, "dp"), get(sharding, "pp"), get(sharding, "tp"),
       get(sharding, "ep"), get(sharding, "etp")};
  paddedVocab = get(sharding, "vocab_padded");
  vocab = vocabAttr.getInt();
  auto stages = sharding.getAs<DenseI64ArrayAttr>("stage_begin");
  if (!stages || int64_t(stages.size()) != d.pp)
    return module.emitError("expected moe.sharding.stage_begin with ")
           << d.pp << " entries";
  stageBegin.assign(stages.asArrayRef().begin(), stages.asArrayRef().end());
  if (d.tp % d.etp)
    return module.emitError("etp (")
           << d.etp << ") must divide tp (" << d.tp
           << ") for partitioned execution: expert tensor parallelism across "
              "data-parallel replicas is not supported yet";
  meshRef = FlatSymbolRefAttr::get(module.getContext(), "mesh");
  expertsRef = FlatSymbolRefAttr::get(module.getContext(), "experts");
  return success();
}

/// Stage of every op of @forward, in order: the layer of the layer weights
/// it uses; the embedding (before any layer) goes first, the final norm and
/// LM head last; ops without weights stay with the layer before them. With
/// `lossOp` (a differentiated training program over stages,
/// PartitionPipeline.cpp), the ops after it are the backward pass
/// (`backwardOf`): its stages fall from the last, the LM head's and final
/// norm's gradients first, the embedding's last, and a weight is used on
/// one stage only.
LogicalResult Partitioner::assignStages(SmallVectorImpl<int64_t> &stageOfOp,
                                        Operation *lossOp,
                                        SmallVectorImpl<bool> *backwardOf) {
  auto stageOfLayer = [&](int64_t layer) {
    return int64_t(llvm::upper_bound(stageBegin, layer) - stageBegin.begin()) - 1;
  };
  int64_t current = 0;
  bool seenLayer = false, backward = false;
  DenseMap<Operation *, int64_t> weightStage, position;
  for (Operation &op : forward.getBody().front()) {
    int64_t stage = current;
    if (!isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op) &&
        !(lossOp && isa<func::ReturnOp>(op))) {
      bool usesWeight = false;
      std::optional<int64_t> layer;
      for (Value operand : op.getOperands())
        if (Operation *w = weightOpOf(operand)) {
          usesWeight = true;
          if (auto l = cast<moe::WeightOpInterface>(w).getDecoderLayer())
            layer = layer ? std::max(*layer, *l) : *l;
        }
      if (layer) {
        seenLayer = true;
        stage = stageOfLayer(*layer);
      } else if (usesWeight) {
        stage = seenLayer != backward ? d.pp - 1 : 0;
      } else if (isa<func::ReturnOp>(op)) {
        stage = d.pp - 1;
      } else if (backward && op.hasAttr("moe.recomputed")) {
        // (A layer's forward op recomputed in the backward pass, by
        // moe-recompute-layers, is its layer's: that of its operands.)
        stage = 0;
        for (Value operand : op.getOperands())
          if (Operation *def = operand.getDefiningOp(); def && position.count(def))
            stage = std::max(stage, stageOfOp[position[def]]);
      }
      if (backward ? stage > current : stage < current)
        return op.emitOpError("belongs to pipeline stage ")
               << stage << " but follows an op of stage " << current
               << (lossOp ? (backward ? " in the backward pass" : " in the forward pass") : "")
               << ": the program does not cut into contiguous stages";
      current = stage;
      for (Value operand : op.getOperands())
        if (Operation *w = weightOpOf(operand); w && lossOp) {
          // (A tied embedding table is the first stage's and the LM head
          // of the last, which add their gradients.)
          auto [it, inserted] = weightStage.try_emplace(w, stage);
          const bool tied =
              cast<moe::WeightOpInterface>(w).getWeightRole() == moe::WeightRole::embedding &&
              std::min(it->second, stage) == 0 && std::max(it->second, stage) == d.pp - 1;
          if (!inserted && it->second != stage && !tied)
            return op.emitOpError("not supported yet: weight '")
                   << weightName(w) << "' is used on pipeline stages " << it->second << " and "
                   << stage << " of a training program (a weight shared by other stages than "
                   << "the first and the last)";
        }
    }
    position[&op] = int64_t(stageOfOp.size());
    stageOfOp.push_back(stage);
    if (backwardOf)
      backwardOf->push_back(backward);
    if (&op == lossOp) {
      if (stage != d.pp - 1)
        return op.emitOpError("the loss is on stage ") << stage << ", not the last";
      backward = true;
      seenLayer = false;
    }
  }
  return success();
}

FailureOr<Value> Partitioner::weight(Value v, Operation *user) {
  mesh::ShardOp shard;
  Operation *w = weightOpOf(v, &shard);
  if (!w)
    return user->emitOpError("expected a weight operand"), failure();
  if (auto it = weights.find(w); it != weights.end())
    return it->second;
  auto type = cast<RankedTensorType>(w->getResult(0).getType());
  if (shard) {
    auto sharding = shard.getShard();
    bool experts = sharding.getMesh().getValue() == "experts";
    for (auto [dim, axes] : llvm::enumerate(sharding.getSplitAxes())) {
      for (mesh::MeshAxis axis : axes.asArrayRef()) {
        int64_t parts = experts ? (axis == kEpAxis ? d.ep : d.etp) : d.tp;
        if (!experts && axis != kTpAxis)
          continue;
        int64_t size = type.getDimSize(dim);
        const moe::WeightRole role = cast<moe::WeightOpInterface>(w).getWeightRole();
        if (!experts && dim == 0 && parts > 1 &&
            (role == moe::WeightRole::embedding || role == moe::WeightRole::lm_head)) {
          // The vocabulary (by the weight's role, not its size): padded
          // rows per rank (the runtime zero-fills rows past the
          // checkpoint's).
          if (size != vocab)
            return user->emitOpError("weight '")
                       << weightName(w) << "' is the " << moe::stringifyWeightRole(role)
                       << " but has " << size << " rows for a vocabulary of " << vocab,
                   failure();
          type = withDim(type, dim, paddedVocab / parts);
          vocabSharded.insert(w);
          continue;
        }
        if (size % parts)
          return user->emitOpError("weight '")
                     << weightName(w) << "' dimension " << dim << " (" << size
                     << ") does not split into " << parts << " parts",
                 failure();
        type = withDim(type, dim, size / parts);
      }
    }
  }
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(entry);
  // After the other weights, in first-use order.
  while (b.getInsertionPoint() != entry->end() &&
         isa<moe::WeightOp, moe::ExpertWeightOp>(*b.getInsertionPoint()))
    b.setInsertionPointAfter(&*b.getInsertionPoint());
  Operation *copy = b.clone(*w);
  copy->getResult(0).setType(type);
  weights[w] = copy->getResult(0);
  return copy->getResult(0);
}

FailureOr<Value> Partitioner::replicated(Value old, Operation *user) {
  auto it = values.find(old);
  if (it == values.end())
    return user->emitOpError("operand is not available on this stage"), failure();
  Mapped &m = it->second;
  switch (m.dist) {
  case Dist::Replicated:
    return m.value;
  case Dist::Partial:
    if (!m.replicated)
      m.replicated = wholeOfPartial(m.value);
    return m.replicated;
  case Dist::Local:
    return user->emitOpError("needs a whole (replicated) operand but it is "
                             "split over tensor parallelism; not supported "
                             "yet"),
           failure();
  }
  return failure();
}

/// The experts' MLPs on this rank's experts. Under EP the blocks must go to
/// the ranks that hold their experts and the outputs come back: the op says
/// over which group (`moe.exchange`), and moe-insert-collectives places the
/// exchanges.
LogicalResult Partitioner::expertFFN(moe::ExpertFFNOp op) {
  FailureOr<Value> gate = weight(op.getGateWeights(), op);
  FailureOr<Value> up = weight(op.getUpWeights(), op);
  FailureOr<Value> down = weight(op.getDownWeights(), op);
  if (failed(gate) || failed(up) || failed(down))
    return failure();
  if (!values.count(op.getBuffer()) || !values.count(op.getCounts()))
    return op.emitOpError("operand is not available on this stage");
  Value buffer = get(op.getBuffer()).value, counts = get(op.getCounts()).value;
  Location loc = op.getLoc();
  auto bufferType = cast<RankedTensorType>(buffer.getType());
  auto ffn = b.create<moe::ExpertFFNOp>(loc, bufferType, buffer, counts, *gate, *up, *down,
                                        op.getActivationAttr());
  if (d.ep > 1)
    ffn->setAttr(moe::kExchangeAttr, group(expertsRef, kEpAxis));
  set(op.getResult(), ffn.getResult(), Dist::Replicated);
  return success();
}

LogicalResult Partitioner::rewrite(Operation &op) {
  Location loc = op.getLoc();
  auto fail = [&](const Twine &message) {
    return op.emitOpError(message), failure();
  };
  auto dist = [&](Value old) { return get(old).dist; };

  if (auto ret = dyn_cast<func::ReturnOp>(op)) {
    SmallVector<Value> results;
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      // A training program's gradient of a split weight: the rank's part.
      if (i > 0 && values.count(v) && get(v).dist == Dist::Local &&
          forward.getResultAttr(i, "moe.gradient_of")) {
        results.push_back(get(v).value);
        continue;
      }
      FailureOr<Value> r = replicated(v, &op);
      if (failed(r))
        return failure();
      results.push_back(*r);
    }
    b.create<func::ReturnOp>(loc, results);
    return success();
  }
  if (isa<moe::ExpertsOp, moe::ExpertsSavedOp, moe::ExpertsGradOp>(op) && (d.ep > 1 || d.tp > 1))
    return fail("needs moe-lower-routing first: routed experts under expert or tensor "
                "parallelism run as dispatch / expert_ffn / combine");
  if (auto ffn = dyn_cast<moe::ExpertFFNOp>(op))
    return expertFFN(ffn);
  // A training program's loss and backward ops (PartitionGradients.cpp).
  bool handled = false;
  if (failed(rewriteTraining(op, handled)))
    return failure();
  if (handled)
    return success();

  // Generic: clone with mapped operands, then fix types and attributes.
  IRMapping mapping;
  for (Value operand : op.getOperands()) {
    if (weightOpOf(operand)) {
      FailureOr<Value> w = weight(operand, &op);
      if (failed(w))
        return failure();
      mapping.map(operand, *w);
      continue;
    }
    if (!values.count(operand))
      return fail("operand is not available on this stage");
  }
  auto mapReplicated = [&]() -> LogicalResult {
    for (Value operand : op.getOperands()) {
      if (weightOpOf(operand))
        continue;
      FailureOr<Value> r = replicated(operand, &op);
      if (failed(r))
        return failure();
      mapping.map(operand, *r);
    }
    return success();
  };
  auto mapAsIs = [&]() {
    for (Value operand : op.getOperands())
      if (!weightOpOf(operand))
        mapping.map(operand, get(operand).value);
  };
  auto cloneAs = [&](Dist resultDist) {
    Operation *copy = b.clone(op, mapping);
    for (auto [old, now] : llvm::zip(op.getResults(), copy->getResults()))
      set(old, now, resultDist);
    return copy;
  };
  auto localWidth = [&](Value v) {
    return cast<RankedTensorType>(mapping.lookup(v).getType()).getDimSize(1);
  };

  if (auto embedding = dyn_cast<moe::EmbeddingOp>(op)) {
    mapAsIs();
    Operation *copy = cloneAs(Dist::Replicated);
    auto table = cast<RankedTensorType>(mapping.lookup(embedding.getTable()).getType());
    if (isVocabSharded(embedding.getTable())) {
      vocabShardedTable = true;
      copy->setAttr("moe.vocab_shard", b.getUnitAttr());
      set(embedding.getResult(), copy->getResult(0), Dist::Partial);
    }
    return success();
  }
  if (auto linear = dyn_cast<moe::LinearOp>(op)) {
    auto w = cast<RankedTensorType>(mapping.lookup(linear.getWeight()).getType());
    int64_t outGlobal = linear.getWeight().getType().getDimSize(0);
    int64_t inGlobal = linear.getWeight().getType().getDimSize(1);
    if (w.getDimSize(1) != inGlobal) {
      // Row-parallel: a local input, a partial output.
      if (dist(linear.getInput()) != Dist::Local)
        return fail("row-parallel weight needs a tensor-parallel split input");
      if (linear.getBias())
        return fail("a bias on a row-parallel layer is not supported yet");
      mapAsIs();
      cloneAs(Dist::Partial);
      return success();
    }
    if (failed(mapReplicated()))
      return failure();
    Operation *copy = cloneAs(Dist::Replicated);
    const bool vocabParallel = isVocabSharded(linear.getWeight());
    if (w.getDimSize(0) == outGlobal && !vocabParallel)
      return success();
    copy->getResult(0).setType(withDim(
        cast<RankedTensorType>(copy->getResult(0).getType()), 1, w.getDimSize(0)));
    // (A training program's LM head feeds only the vocabulary-parallel
    // cross-entropy: its logits stay split, PartitionGradients.cpp.)
    const bool onlyLoss = llvm::all_of(linear.getResult().getUsers(), [](Operation *user) {
      return isa<moe::CrossEntropyOp, moe::CrossEntropyGradOp>(user);
    });
    if (!vocabParallel || onlyLoss) {
      set(linear.getResult(), copy->getResult(0), Dist::Local);
      return success();
    }
    // The LM head: the whole logits are the vocabulary parts of the group
    // (moe-insert-collectives gathers them and drops the padding).
    auto whole = b.create<UnrealizedConversionCastOp>(loc, linear.getResult().getType(),
                                                      copy->getResult(0));
    whole->setAttr(moe::kGatherAttr, group(meshRef, kTpAxis));
    set(linear.getResult(), whole.getResult(0), Dist::Replicated);
    return success();
  }
  if (isa<moe::RMSNormOp, moe::LayerNormOp>(op)) {
    Value input = op.getOperand(0);
    if (dist(input) == Dist::Local) {
      int64_t group = cast<RankedTensorType>(op.getOperand(1).getType()).getNumElements();
      int64_t global = cast<RankedTensorType>(input.getType()).getDimSize(1);
      if (isa<moe::LayerNormOp>(op))
        return fail("a layer_norm of rows that tensor parallelism splits: not supported yet; "
                    "use --ep, --dp or --pp");
      mapAsIs();
      // A norm of the whole row (OLMoE's q_norm / k_norm): the rank's part
      // of each row's sum of squares, added over tp, then its part of the
      // row normalised by the whole row's mean.
      if (group == global) {
        auto norm = cast<moe::RMSNormOp>(op);
        if (norm.getSumSquares())
          return fail("expected a norm of whole rows before moe-partition");
        Value part = mapping.lookup(input);
        auto partType = cast<RankedTensorType>(part.getType());
        auto squaresType = RankedTensorType::get({partType.getDimSize(0), 1}, b.getF32Type());
        Value squares =
            b.create<moe::RowSumSquaresOp>(op.getLoc(), squaresType, part).getResult();
        FailureOr<Value> w = weight(norm.getWeight(), &op);
        if (failed(w))
          return failure();
        auto copy = b.create<moe::RMSNormOp>(op.getLoc(), partType, part, *w,
                                             wholeOfPartial(squares), norm.getEpsilonAttr(),
                                             b.getI64IntegerAttr(global));
        set(norm.getResult(), copy.getResult(), Dist::Local);
        return success();
      }
      if (localWidth(input) % group)
        return fail("norm groups do not divide the tensor-parallel width");
      Operation *copy = cloneAs(Dist::Local);
      copy->getResult(0).setType(cast<RankedTensorType>(mapping.lookup(input).getType()));
      return success();
    }
    if (failed(mapReplicated()))
      return failure();
    cloneAs(Dist::Replicated);
    return success();
  }
  if (auto rope = dyn_cast<moe::RopeOp>(op)) {
    mapAsIs();
    Dist dd = dist(rope.getInput());
    if (dd == Dist::Partial)
      return fail("rotates a partial sum");
    Operation *copy = cloneAs(dd);
    copy->getResult(0).setType(mapping.lookup(rope.getInput()).getType());
    return success();
  }
  if (auto attention = dyn_cast<moe::AttentionOp>(op)) {
    if (d.tp > 1) {
      if (attention.getNumHeads() % d.tp || attention.getNumKvHeads() % d.tp)
        return fail("heads and KV heads must split over tp");
      for (Value v : {attention.getQuery(), attention.getKey(), attention.getValue()})
        if (dist(v) != Dist::Local)
          return fail("expected head-split query, key and value under TP");
    }
    mapAsIs();
    Operation *copy = cloneAs(d.tp > 1 ? Dist::Local : Dist::Replicated);
    auto a = cast<moe::AttentionOp>(copy);
    a.setNumHeads(attention.getNumHeads() / d.tp);
    a.setNumKvHeads(attention.getNumKvHeads() / d.tp);
    a.getResult().setType(withDim(attention.getResult().getType(), 1,
                                  attention.getResult().getType().getDimSize(1) / d.tp));
    return success();
  }
  if (auto mla = dyn_cast<moe::MLAttentionOp>(op)) {
    if (d.tp > 1) {
      if (mla.getNumHeads() % d.tp)
        return fail("heads must split over tp");
      if (dist(mla.getQuery()) != Dist::Local || dist(mla.getKv()) != Dist::Local ||
          dist(mla.getKeyRope()) != Dist::Replicated)
        return fail("expected head-split query and kv and a whole key_rope under TP");
    }
    mapAsIs();
    Operation *copy = cloneAs(d.tp > 1 ? Dist::Local : Dist::Replicated);
    auto a = cast<moe::MLAttentionOp>(copy);
    a.setNumHeads(mla.getNumHeads() / d.tp);
    int64_t width = mla.getResult().getType().getDimSize(1);
    a.getResult().setType(withDim(mla.getResult().getType(), 1, width / d.tp));
    return success();
  }
  if (isa<moe::AddOp>(op)) {
    Dist l = dist(op.getOperand(0)), r = dist(op.getOperand(1));
    if (l == r) {
      mapAsIs();
      Operation *copy = cloneAs(l);
      copy->getResult(0).setType(mapping.lookup(op.getOperand(0)).getType());
      return success();
    }
    if (failed(mapReplicated()))
      return failure();
    cloneAs(Dist::Replicated);
    return success();
  }
  if (auto gate = dyn_cast<moe::SigmoidGateOp>(op)) {
    // x * sigmoid(g): linear in x, so a partial x stays partial.
    FailureOr<Value> g = replicated(gate.getGate(), &op);
    if (failed(g))
      return failure();
    mapping.map(gate.getGate(), *g);
    Dist dx = dist(gate.getInput());
    if (dx == Dist::Local)
      return fail("gates a tensor-parallel split value");
    mapping.map(gate.getInput(), get(gate.getInput()).value);
    cloneAs(dx);
    return success();
  }
  if (isa<moe::MLPOp>(op)) {
    if (failed(mapReplicated()))
      return failure();
    cloneAs(d.tp > 1 ? Dist::Partial : Dist::Replicated);
    return success();
  }
  if (auto dispatch = dyn_cast<moe::DispatchOp>(op)) {
    // Every rank of a TP group routes all T rows alike but dispatches only
    // its row part (its ETP slices see the same rows): the group's ranks
    // share the dispatch and the expert work.
    if (failed(mapReplicated()))
      return failure();
    Operation *copy = cloneAs(Dist::Replicated);
    copy->setAttr("row_parts", b.getI64IntegerAttr(d.tp / d.etp));
    copy->setAttr("row_part_stride", b.getI64IntegerAttr(d.etp));
    return success();
  }
  if (auto combine = dyn_cast<moe::CombineOp>(op)) {
    // The blocks and slots are this rank's (as dispatched); the routing
    // weights are whole. Under TP the ranks of a group combined different
    // rows (and ETP slices): the group's sum is the whole result.
    if (!values.count(combine.getOutputs()) || !values.count(combine.getSlots()))
      return fail("operand is not available on this stage");
    mapping.map(combine.getOutputs(), get(combine.getOutputs()).value);
    mapping.map(combine.getSlots(), get(combine.getSlots()).value);
    FailureOr<Value> routing = replicated(combine.getWeights(), &op);
    if (failed(routing))
      return failure();
    mapping.map(combine.getWeights(), *routing);
    cloneAs(d.tp > 1 ? Dist::Partial : Dist::Replicated);
    return success();
  }
  if (isa<moe::SplitOp, moe::ConcatOp, moe::RouterOp, moe::RouteOp, moe::ExpertsOp>(op)) {
    if (failed(mapReplicated()))
      return failure();
    cloneAs(Dist::Replicated);
    return success();
  }
  return fail("cannot be partitioned (no rule for this op)");
}

func::FuncOp Partitioner::startFunction(StringRef name, int64_t stage, StringRef entryName,
                                        ArrayRef<Type> inputs, ArrayRef<Type> results) {
  values.clear();
  weights.clear();
  b.setInsertionPoint(forward);
  auto fn = b.create<func::FuncOp>(forward.getLoc(), name, b.getFunctionType(inputs, results));
  Block &body = forward.getBody().front();
  for (unsigned i = 0; i < body.getNumArguments(); ++i)
    fn.setArgAttrs(i, forward.getArgAttrDict(i));
  if (!entryName.empty())
    fn->setAttr("moe.entry", b.getStringAttr(entryName));
  fn->setAttr("moe.stage", b.getI64IntegerAttr(stage));
  entry = fn.addEntryBlock();
  b.setInsertionPointToEnd(entry);
  for (auto [old, now] : llvm::zip(body.getArguments(), entry->getArguments()))
    set(old, now, Dist::Replicated);
  return fn;
}

LogicalResult Partitioner::buildStage(int64_t stage, ArrayRef<int64_t> stageOfOp,
                                      ArrayRef<Value> incoming,
                                      ArrayRef<Value> outgoing) {
  bool last = stage == d.pp - 1;
  // The stage's signature: the model's inputs and the values the stage
  // before sends it; the logits (last stage) or the values it sends on.
  // moe-insert-collectives makes the marked ones moe.recv / moe.send.
  FunctionType type = forward.getFunctionType();
  SmallVector<Type> inputs(type.getInputs()), results;
  for (Value v : incoming)
    inputs.push_back(v.getType());
  for (Value v : outgoing)
    results.push_back(v.getType());
  if (last)
    results.assign(type.getResults().begin(), type.getResults().end());
  auto entryName = forward->getAttrOfType<StringAttr>("moe.entry");
  func::FuncOp fn = startFunction(("stage" + Twine(stage)).str(), stage,
                                  entryName ? entryName.getValue() : StringRef(), inputs,
                                  results);
  const unsigned modelInputs = type.getNumInputs();
  for (unsigned i = modelInputs; i < inputs.size(); ++i)
    fn.setArgAttr(i, moe::kRecvFromAttr, b.getI64IntegerAttr(stage - 1));
  if (!last)
    for (unsigned i = 0; i < results.size(); ++i)
      fn.setResultAttr(i, moe::kSendToAttr, b.getI64IntegerAttr(stage + 1));
  else // a training program's results name the weights of their gradients
    for (unsigned i = 0; i < results.size(); ++i)
      fn.setResultAttrs(i, forward.getResultAttrDict(i));
  Block &body = forward.getBody().front();
  for (auto [v, arg] : llvm::zip(incoming, entry->getArguments().drop_front(modelInputs)))
    set(v, arg, Dist::Replicated);
  int64_t i = 0;
  for (Operation &op : body) {
    int64_t s = stageOfOp[i++];
    if (s != stage || isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op))
      continue;
    if (failed(rewrite(op)))
      return failure();
  }
  if (last) {
    // The model's return op came with the stage's ops; a training
    // program's gradients of split weights are the rank's parts.
    auto ret = cast<func::ReturnOp>(entry->getTerminator());
    fn.setType(b.getFunctionType(inputs, ret.getOperandTypes()));
    return success();
  }
  SmallVector<Value> sent;
  for (Value v : outgoing) {
    FailureOr<Value> r = replicated(v, forward);
    if (failed(r))
      return failure();
    sent.push_back(*r);
  }
  b.create<func::ReturnOp>(forward.getLoc(), sent);
  return success();
}

LogicalResult Partitioner::run() {
  if (failed(readSharding()))
    return failure();
  // A differentiated training program (its gradients follow the loss) over
  // pipeline stages: a forward and a backward function per stage.
  auto entryName = forward->getAttrOfType<StringAttr>("moe.entry");
  if (d.pp > 1 && entryName && entryName.getValue() == "train" && forward.getNumResults() == 1)
    return forward.emitError("not supported yet: a loss-only training program over pp ")
           << d.pp << " stages";
  if (d.pp > 1 && entryName && entryName.getValue() == "train") {
    if (failed(runPipelined()))
      return failure();
    return finish();
  }
  SmallVector<int64_t> stageOfOp;
  if (failed(assignStages(stageOfOp)))
    return failure();
  // Values live across each cut, in definition order.
  Block &body = forward.getBody().front();
  DenseMap<Operation *, int64_t> stageOf;
  int64_t i = 0;
  for (Operation &op : body)
    stageOf[&op] = stageOfOp[i++];
  std::vector<SmallVector<Value>> crossing(d.pp);
  for (Operation &op : body) {
    if (isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op))
      continue;
    for (Value result : op.getResults()) {
      int64_t lastUse = stageOf[&op];
      for (Operation *user : result.getUsers())
        lastUse = std::max(lastUse, stageOf[user]);
      for (int64_t s = stageOf[&op]; s < lastUse; ++s)
        crossing[s].push_back(result);
    }
  }
  for (int64_t s = 0; s < d.pp; ++s)
    if (failed(buildStage(s, stageOfOp, s ? ArrayRef<Value>(crossing[s - 1])
                                          : ArrayRef<Value>(),
                          crossing[s])))
      return failure();
  return finish();
}

LogicalResult Partitioner::finish() {
  // The model's whole weights, for the plan (moe-emit-plan), and its sizes
  // as the ops state them, for the planner after partitioning.
  module->setAttr("moe.logical_weights", moe::logicalWeightsAttr(forward));
  llvm::Expected<DictionaryAttr> sizes = moe::modelSizes(module);
  if (!sizes)
    return module.emitError(llvm::toString(sizes.takeError())), failure();
  if (*sizes)
    module->setAttr("moe.model_sizes", *sizes);
  forward.erase();
  return success();
}

} // namespace moe::partition

namespace {

using moe::partition::Partitioner;

struct Partition : moe::impl::MoEPartitionBase<Partition> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (!forward || forward.getBody().getBlocks().size() != 1) {
      module.emitError("expected a single-block func.func @forward");
      return signalPassFailure();
    }
    if (failed(Partitioner(module, forward).run()))
      signalPassFailure();
  }
};

} // namespace
