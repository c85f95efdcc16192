//===- PartitionPipeline.cpp - moe-partition over pipeline stages -*- C++ -*-===//
//
// A differentiated training program cut into pipeline stages
// (docs/training.md, "Pipeline parallelism"): each stage gets a forward
// function (@stage<s>_forward, entry "train_forward": its layers' forward
// ops, the last stage's loss too) and a backward function (@stage<s>,
// entry "train": its layers' backward ops, its weights' gradients), so that
// a schedule (moe-schedule-pipeline) can interleave the micro-batches'
// forward and backward steps (1F1B).
//
// The program is one block: forward ops, the loss, then the backward ops
// (moe-differentiate). A forward op's stage is its layer's as in inference;
// a backward op's the layer of the weights it uses (the LM head's and final
// norm's: the last stage; the embedding's: the first), else the op's before
// it, so stages rise through the forward ops and fall through the backward
// ones. A value a later step needs travels the shortest way there:
//   - forward to a later stage's forward or backward: sent stage to stage
//     with the forward's activations (moe.send_to / moe.recv_from), as the
//     router statistics of the load-balancing loss go to the last stage;
//   - forward to the same stage's backward: kept on the rank (moe.stash),
//     one slot per micro-batch in flight;
//   - to an earlier stage's backward: kept, then sent stage to stage down
//     with the backward's gradients (a later layer's router statistics that
//     the first layers' router gradient reads).
// The model's inputs (tokens, positions, labels) are arguments of every
// function: the runtime writes the micro-batch's into each.
//
//===----------------------------------------------------------------------===//
#include "Partitioner.h"
#include "moe/Transforms/Passes.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

namespace moe::partition {

LogicalResult Partitioner::runPipelined() {
  Block &body = forward.getBody().front();
  auto ret = cast<func::ReturnOp>(body.getTerminator());
  Operation *lossOp = ret.getOperand(0).getDefiningOp();
  if (!lossOp)
    return forward.emitError("expected the loss as the program's first result");

  // Stage and phase of every op.
  SmallVector<int64_t> stageOf;
  SmallVector<bool> backwardOf;
  if (failed(assignStages(stageOf, lossOp, &backwardOf)))
    return failure();
  DenseMap<Operation *, int64_t> index;
  for (Operation &op : body)
    index[&op] = int64_t(index.size());

  // A recomputed attention (moe-recompute-layers) writes its original's KV
  // cache: its place among the program's attentions becomes its place
  // among its stage's forward function's.
  SmallVector<int64_t> attentionsBefore(d.pp + 1, 0);
  for (Operation &op : body)
    if (isa<moe::AttentionOp, moe::MLAttentionOp>(op) && !backwardOf[index[&op]])
      ++attentionsBefore[stageOf[index[&op]] + 1];
  for (int64_t s = 0; s < d.pp; ++s)
    attentionsBefore[s + 1] += attentionsBefore[s];
  for (Operation &op : body)
    if (auto of = op.getAttrOfType<IntegerAttr>("moe.recomputes_cache_of"))
      op.setAttr("moe.recomputes_cache_of",
                 b.getI64IntegerAttr(of.getInt() - attentionsBefore[stageOf[index[&op]]]));

  // A tied table's gradient is the sum of its two uses' (the LM head's on
  // the last stage, the lookup's on the first): each stage returns its
  // part, and the optimizer adds the parts over the stages (a group of the
  // first and last), so the add goes.
  DenseSet<Operation *> dropped;
  SmallVector<Port> tiedParts;
  SmallVector<Attribute> tiedNames;
  for (unsigned i = 1; i < ret.getNumOperands(); ++i) {
    auto add = ret.getOperand(i).getDefiningOp<moe::AddOp>();
    if (!add || !add->hasOneUse())
      continue;
    Operation *lhs = add->getOperand(0).getDefiningOp(), *rhs = add->getOperand(1).getDefiningOp();
    if (!lhs || !rhs || stageOf[index[lhs]] == stageOf[index[rhs]])
      continue;
    dropped.insert(add);
    tiedParts.push_back({add->getOperand(0), "moe.gradient_of", i});
    tiedParts.push_back({add->getOperand(1), "moe.gradient_of", i});
    tiedNames.push_back(forward.getResultAttr(i, "moe.gradient_of"));
  }
  if (!tiedNames.empty())
    module->setAttr("moe.tied_over_stages", b.getArrayAttr(tiedNames));

  // Where each value goes (the header's three ways), in program order.
  std::vector<llvm::SetVector<Value>> sendForward(d.pp), sendBackward(d.pp), stash(d.pp);
  for (Operation &op : body) {
    if (isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp, func::ReturnOp>(op) ||
        dropped.contains(&op))
      continue;
    const int64_t from = stageOf[index[&op]];
    const bool fromBackward = backwardOf[index[&op]];
    for (Value v : op.getResults()) {
      // The highest stage that needs it, the lowest backward use.
      int64_t top = from, low = d.pp;
      bool usedBackward = false;
      SmallVector<int64_t> backwardUses;
      for (Operation *user : v.getUsers()) {
        if (isa<func::ReturnOp>(user) || dropped.contains(user))
          continue;
        const int64_t s = stageOf[index[user]];
        if (backwardOf[index[user]]) {
          backwardUses.push_back(s);
          usedBackward = true;
          low = std::min(low, s);
        }
        if (!fromBackward)
          top = std::max(top, s);
      }
      if (!fromBackward) {
        for (int64_t s = from; s < top; ++s)
          sendForward[s].insert(v);
        for (int64_t s : backwardUses)
          if (s > from)
            stash[s].insert(v);
        if (usedBackward && low <= from)
          stash[from].insert(v);
      }
      for (int64_t s = from; s > low && usedBackward; --s)
        sendBackward[s].insert(v);
    }
  }

  // The gradients each stage's backward function returns.
  std::vector<SmallVector<Port>> gradients(d.pp);
  for (unsigned i = 1; i < ret.getNumOperands(); ++i) {
    Value g = ret.getOperand(i);
    Operation *def = g.getDefiningOp();
    if (dropped.contains(def))
      continue;
    if (!def || !backwardOf[index[def]])
      return ret.emitOpError("result ") << i << " is not computed by the backward pass";
    gradients[stageOf[index[def]]].push_back({g, "moe.gradient_of", i});
  }
  for (const Port &p : tiedParts)
    gradients[stageOf[index[p.old.getDefiningOp()]]].push_back(p);

  SmallVector<Operation *> ops;
  for (Operation &op : body)
    ops.push_back(&op);
  auto between = [&](int64_t s, bool phase) {
    return [&, s, phase](int64_t i) {
      return stageOf[i] == s && backwardOf[i] == phase && !dropped.contains(ops[i]);
    };
  };
  // The forward functions in stage order, then the backward ones the other
  // way (each takes what the ones before it give, as they give it).
  for (int64_t s = 0; s < d.pp; ++s) {
    SmallVector<Port> args, results;
    if (s > 0)
      for (Value v : sendForward[s - 1])
        args.push_back({v, kRecvFromAttr, s - 1});
    if (s == d.pp - 1)
      results.push_back({ret.getOperand(0), "", 0});
    for (Value v : sendForward[s])
      results.push_back({v, kSendToAttr, s + 1});
    for (auto [i, v] : llvm::enumerate(stash[s]))
      results.push_back({v, kStashAttr, int64_t(i)});
    if (failed(buildFunction(("stage" + Twine(s) + "_forward").str(), s, "train_forward",
                             between(s, false), args, results)))
      return failure();
  }
  for (int64_t s = d.pp - 1; s >= 0; --s) {
    SmallVector<Port> args, results;
    for (auto [i, v] : llvm::enumerate(stash[s]))
      args.push_back({v, kStashAttr, int64_t(i)});
    if (s + 1 < d.pp)
      for (Value v : sendBackward[s + 1])
        args.push_back({v, kRecvFromAttr, s + 1});
    if (s > 0)
      for (Value v : sendBackward[s])
        results.push_back({v, kSendToAttr, s - 1});
    results.append(gradients[s]);
    if (failed(buildFunction(("stage" + Twine(s)).str(), s, "train", between(s, true), args,
                             results)))
      return failure();
  }
  // (In stage order, as every entry's programs are.)
  for (int64_t s = 0; s < d.pp; ++s)
    module.lookupSymbol<func::FuncOp>(("stage" + Twine(s)).str())->moveBefore(forward);
  return success();
}

LogicalResult Partitioner::buildFunction(StringRef name, int64_t stage, StringRef entryName,
                                         function_ref<bool(int64_t)> includes,
                                         ArrayRef<Port> args, ArrayRef<Port> results) {
  FunctionType type = forward.getFunctionType();
  SmallVector<Type> inputs(type.getInputs());
  // (A value another function gave: its type there, a rank's part of a
  // split value.)
  for (const Port &p : args)
    inputs.push_back(portType.count(p.old) ? portType.lookup(p.old) : p.old.getType());
  func::FuncOp fn = startFunction(name, stage, entryName, inputs, {});
  const unsigned modelInputs = type.getNumInputs();
  for (auto [i, p] : llvm::enumerate(args))
    fn.setArgAttr(modelInputs + i, p.attr, b.getI64IntegerAttr(p.value));
  Block &body = forward.getBody().front();
  for (auto [p, arg] : llvm::zip(args, entry->getArguments().drop_front(modelInputs)))
    set(p.old, arg, portDist.lookup(p.old));
  int64_t i = 0;
  for (Operation &op : body) {
    if (!includes(i++) ||
        isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp, func::ReturnOp>(op))
      continue;
    Operation *last = entry->empty() ? nullptr : &entry->back();
    if (failed(rewrite(op)))
      return failure();
    // A recomputed op's rank-local ops are recomputed ones too (the
    // generic rewrite keeps the mark; the specific ones build new ops).
    if (op.hasAttr("moe.recomputed"))
      for (Operation &made : llvm::make_range(
               last ? std::next(last->getIterator()) : entry->begin(), entry->end()))
        made.setAttr("moe.recomputed", b.getUnitAttr());
  }
  SmallVector<Value> operands;
  for (const Port &p : results) {
    // A value another function takes goes as it is (a rank's part of a
    // split value stays its part), a partial sum whole; but a partial sum
    // kept for the stage's own backward stays partial, so that what the
    // backward function computes from it (a recomputed layer's residual
    // add) rounds as the forward's did.
    auto it = values.find(p.old);
    if (it != values.end() && !p.attr.empty() &&
        (it->second.dist == Dist::Local || it->second.dist == Dist::Partial)) {
      operands.push_back(it->second.value);
      portDist[p.old] = it->second.dist;
      portType[p.old] = it->second.value.getType();
      continue;
    }
    FailureOr<Value> r = replicated(p.old, forward);
    if (failed(r))
      return failure();
    operands.push_back(*r);
    portType[p.old] = r->getType();
  }
  b.create<func::ReturnOp>(forward.getLoc(), operands);
  fn.setType(b.getFunctionType(inputs, ValueRange(operands).getTypes()));
  for (auto [i, p] : llvm::enumerate(results)) {
    if (p.attr == "moe.gradient_of")
      fn.setResultAttrs(i, forward.getResultAttrDict(p.value));
    else if (p.attr.empty())
      fn.setResultAttrs(i, forward.getResultAttrDict(0));
    else
      fn.setResultAttr(i, p.attr, b.getI64IntegerAttr(p.value));
  }
  return success();
}

} // namespace moe::partition
