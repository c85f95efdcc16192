//===- LowerToExec.cpp - moe programs to exec programs ----------*- C++ -*-===//
//
// moe-lower-to-exec: each program of the module (@forward, or every
// @stage<s> of a partitioned one), after moe-assign-buffers, becomes an
// exec.program: its buffers, the weights in the order its launches first
// bind them, its KV caches and inputs declared, then one exec.launch (a
// kernel id with its constants) or exec.collective (with its group or peer)
// per op, in order. The op-specific knowledge of what a kernel needs (its
// constants) lives here, once; the plan writer and the targets read the
// exec ops only.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/Exec/IR/ExecOps.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

namespace moe {
#define GEN_PASS_DEF_MOELOWERTOEXEC
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;
namespace exec = moe::exec;

namespace {

DictionaryAttr ropeConstants(Builder &b, moe::RopeAttr rope) {
  auto f = [&](APFloat v) { return b.getF64FloatAttr(v.convertToDouble()); };
  return b.getDictionaryAttr({
      b.getNamedAttr("kind", b.getStringAttr(moe::stringifyRopeKind(rope.getKind()))),
      b.getNamedAttr("theta", f(rope.getTheta())),
      b.getNamedAttr("rotary_dim", b.getI64IntegerAttr(rope.getRotaryDim())),
      b.getNamedAttr("interleaved", b.getBoolAttr(rope.getInterleaved())),
      b.getNamedAttr("factor", f(rope.getFactor())),
      b.getNamedAttr("original_max_position", b.getI64IntegerAttr(rope.getOriginalMaxPosition())),
      b.getNamedAttr("low_freq_factor", f(rope.getLowFreqFactor())),
      b.getNamedAttr("high_freq_factor", f(rope.getHighFreqFactor())),
      b.getNamedAttr("beta_fast", f(rope.getBetaFast())),
      b.getNamedAttr("beta_slow", f(rope.getBetaSlow())),
      b.getNamedAttr("truncate", b.getBoolAttr(rope.getTruncate())),
      b.getNamedAttr("attention_factor", f(rope.getAttentionFactor())),
  });
}

DictionaryAttr routingConstants(Builder &b, moe::RoutingAttr r) {
  return b.getDictionaryAttr({
      b.getNamedAttr("scoring", b.getStringAttr(moe::stringifyScoringFunc(r.getScoring()))),
      b.getNamedAttr("top_k", b.getI64IntegerAttr(r.getTopK())),
      b.getNamedAttr("topk_on", b.getStringAttr(moe::stringifyTopKInput(r.getTopkOn()))),
      b.getNamedAttr("normalize", b.getBoolAttr(r.getNormalize())),
      b.getNamedAttr("scaling_factor", b.getF64FloatAttr(r.getScalingFactor().convertToDouble())),
      b.getNamedAttr("num_groups", b.getI64IntegerAttr(r.getNumGroups())),
      b.getNamedAttr("topk_groups", b.getI64IntegerAttr(r.getTopkGroups())),
      b.getNamedAttr("group_score", b.getStringAttr(moe::stringifyGroupScore(r.getGroupScore()))),
      // Plans of format 1 compute every activation in f32, the router's
      // included, whatever the model's dtype (the IR keeps the reference's
      // compute_type for a later bf16 plan).
      b.getNamedAttr("compute_type", b.getStringAttr("F32")),
  });
}

/// The constants of an op's kernel: what a target needs beyond its buffers
/// and weights.
NamedAttrList kernelConstants(Builder &b, Operation *op) {
  NamedAttrList a;
  auto f64 = [&](APFloat v) { return b.getF64FloatAttr(v.convertToDouble()); };
  auto i64 = [&](int64_t v) { return b.getI64IntegerAttr(v); };
  if (auto kv = op->getAttrOfType<IntegerAttr>("moe.kv_cache"))
    a.set("kv_cache", i64(kv.getInt()));
  if (op->hasAttr("moe.recomputed"))
    a.set("recompute", b.getBoolAttr(true));
  llvm::TypeSwitch<Operation *>(op)
      .Case([&](moe::RMSNormOp o) {
        a.set("eps", f64(o.getEpsilon()));
        if (auto width = o.getRowWidth()) // (a part of rows TP splits)
          a.set("row_width", i64(*width));
      })
      .Case([&](moe::LayerNormOp o) { a.set("eps", f64(o.getEpsilon())); })
      .Case([&](moe::AddNormOp o) {
        a.set("eps", f64(o.getEpsilon()));
        a.set("norm", b.getStringAttr(o.getLayer() ? "layer_norm" : "rms_norm"));
      })
      .Case<moe::RopeOp, moe::RopeGradOp>([&](auto o) {
        a.set("head_dim", i64(o.getHeadDim()));
        a.set("rope", ropeConstants(b, o.getRope()));
      })
      .Case<moe::AttentionOp, moe::AttentionGradOp>([&](auto o) {
        a.set("heads", i64(o.getNumHeads()));
        a.set("kv_heads", i64(o.getNumKvHeads()));
        a.set("scale", f64(o.getScale()));
        a.set("sliding_window", i64(o.getSlidingWindow() ? *o.getSlidingWindow() : 0));
      })
      .Case<moe::MLAttentionOp, moe::MLAttentionGradOp>([&](auto o) {
        a.set("heads", i64(o.getNumHeads()));
        a.set("scale", f64(o.getScale()));
        a.set("rope", ropeConstants(b, o.getRope()));
      })
      .Case<moe::MLPOp, moe::MLPGradOp>([&](auto o) {
        a.set("activation", b.getStringAttr(moe::stringifyActivation(o.getActivation())));
      })
      .Case<moe::ExpertFFNOp, moe::ExpertFFNGradOp>([&](auto o) {
        a.set("activation", b.getStringAttr(moe::stringifyActivation(o.getActivation())));
      })
      .Case([&](moe::ExpertsOp o) {
        a.set("activation", b.getStringAttr(moe::stringifyActivation(o.getActivation())));
      })
      .Case<moe::ExpertsSavedOp, moe::ExpertsGradOp>([&](auto o) {
        a.set("activation", b.getStringAttr(moe::stringifyActivation(o.getActivation())));
        if (o.getCapacityFactor())
          a.set("capacity_factor", f64(*o.getCapacityFactor()));
      })
      .Case([&](moe::DispatchOp o) {
        a.set("num_experts", i64(o.getNumExperts()));
        a.set("capacity", i64(o.getCapacity()));
        a.set("capacity_factor", f64(o.getCapacityFactor()));
        a.set("top_k", i64(o.getExperts().getType().getDimSize(1)));
        a.set("row_parts", i64(o.getRowParts()));
        a.set("row_part_stride", i64(o.getRowPartStride()));
      })

      .Case<moe::CrossEntropyOp, moe::VocabStatsOp, moe::CrossEntropyOfStatsOp>(
          [&](auto o) { a.set("vocab", i64(o.getVocab())); })
      .Case([&](moe::RMSNormGradOp o) {
        a.set("eps", f64(o.getEpsilon()));
        if (auto width = o.getRowWidth()) // (a part of rows TP splits)
          a.set("row_width", i64(*width));
      })

      .Case([&](moe::AllReduceOp o) {
        // A weight gradient's parts (static): its values, not the rows.
        auto t = cast<RankedTensorType>(o.getInput().getType());
        if (t.hasStaticShape())
          a.set("elements", i64(t.getNumElements()));
      })
      .Case([&](moe::AddOp o) {
        // A sum of weight gradients: static rows, not the step's tokens.
        if (o.getType().hasStaticShape())
          a.set("elements", i64(o.getType().getNumElements()));
      })
      .Case([&](moe::RouterStatsOp o) {
        a.set("top_k", i64(o.getTopK()));
        if (o.getSequences())
          a.set("sequences", i64(*o.getSequences()));
      })

      .Case([&](moe::SendOp o) { a.set("stage", i64(o.getStage())); })
      .Case([&](moe::RecvOp o) { a.set("stage", i64(o.getStage())); })
      .Case([&](moe::RouterOp o) { a.set("routing", routingConstants(b, o.getRouting())); })
      .Case<moe::RouteOp, moe::RouteGradOp>(
          [&](auto o) { a.set("routing", routingConstants(b, o.getRouting())); })
      .Case<moe::LMLossOp, moe::RouterStatsGradOp>([&](auto o) {
        a.set("aux_coef", f64(o.getAuxCoef()));
        a.set("z_coef", f64(o.getZCoef()));
        // Per-sequence statistics (router_stats' sequences): B of them.
        if (!o.getRouterStats().empty()) {
          auto rows = cast<RankedTensorType>(o.getRouterStats().front().getType()).getDimSize(0);
          if (rows > 3)
            a.set("sequences", i64((rows - 3) / 2));
        }
      });
  // A rank's part of the padded vocabulary (the embedding, the
  // cross-entropy's statistics and gradient, the embedding's gradient).
  if (op->hasAttr("moe.vocab_shard"))
    a.set("vocab_shard", b.getBoolAttr(true));
  if (auto o = dyn_cast<moe::CrossEntropyGradOp>(op))
    a.set("vocab", i64(o.getVocab()));
  if (auto o = dyn_cast<moe::EmbeddingGradOp>(op); o && o.getPaddingIdx())
    a.set("padding_idx", i64(*o.getPaddingIdx()));
  // split: the parts' widths (its results'); concat: its inputs'.
  if (isa<moe::SplitOp, moe::ConcatOp>(op)) {
    SmallVector<Attribute> widths;
    for (Value v : isa<moe::SplitOp>(op) ? ValueRange(op->getResults()) : op->getOperands())
      widths.push_back(i64(cast<RankedTensorType>(v.getType()).getDimSize(1)));
    a.set("widths", b.getArrayAttr(widths));
  }
  return a;
}

const char *axisName(StringRef mesh, int64_t axis) {
  static const char *attention[] = {"pp", "dp", "tp"};
  static const char *experts[] = {"pp", "edp", "ep", "etp"};
  if (mesh == "experts")
    return axis < 4 ? experts[axis] : "?";
  return axis < 3 ? attention[axis] : "?";
}

/// The LM head: the linear whose result the program returns (a training
/// program: whose result its cross-entropy reads; the loss is its first
/// result, the gradients follow), directly or through the all_gather / split
/// that join its vocabulary parts.
Operation *headOf(func::FuncOp fn) {
  auto ret = cast<func::ReturnOp>(fn.getBody().front().getTerminator());
  if (ret.getNumOperands() == 0 ||
      (ret.getNumOperands() > 1 && !ret.getOperand(0).getDefiningOp<moe::LMLossOp>()))
    return nullptr;
  Value v = ret.getOperand(0);
  if (auto loss = v.getDefiningOp<moe::LMLossOp>()) {
    Operation *ce = loss.getCrossEntropy().getDefiningOp();
    if (auto whole = dyn_cast_or_null<moe::CrossEntropyOp>(ce)) {
      v = whole.getLogits();
    } else if (auto parts = dyn_cast_or_null<moe::CrossEntropyOfStatsOp>(ce)) {
      // (The vocabulary-parallel cross-entropy: the logits of its parts'
      // statistics, through their gather.)
      auto gather = parts.getStats().getDefiningOp<moe::AllGatherOp>();
      auto stats = gather ? gather.getInput().getDefiningOp<moe::VocabStatsOp>() : nullptr;
      if (!stats)
        return nullptr;
      v = stats.getLogits();
    } else {
      return nullptr;
    }
  }
  while (Operation *def = v.getDefiningOp()) {
    if (isa<moe::LinearOp>(def))
      return def;
    if (!isa<moe::AllGatherOp, moe::SplitOp>(def))
      return nullptr;
    v = def->getOperand(0);
  }
  return nullptr;
}

struct Lowering {
  ModuleOp module;
  int64_t maxTokens;

  /// The weight op (moe.weight / moe.expert_weight) a value names, through
  /// sharding annotations.
  static Operation *weightOf(Value v) {
    moe::WeightOpInterface w = moe::weightBehind(v);
    return w ? w.getOperation() : nullptr;
  }

  /// exec.weight of weight op `w` (its rank-local type), at `b`.
  static Value declareWeight(OpBuilder &b, Operation *w) {
    auto type = cast<RankedTensorType>(w->getResult(0).getType());
    IntegerAttr experts;
    if (auto e = dyn_cast<moe::ExpertWeightOp>(w))
      experts = b.getI64IntegerAttr(e.getNumExperts());
    Value declared = b.create<exec::WeightOp>(
        w->getLoc(), b.getType<exec::WeightType>(),
        b.getStringAttr(cast<moe::WeightOpInterface>(w).getTensorName()), TypeAttr::get(type),
        experts);
    // moe-quantize-weights' mark: moert keeps the weight as int8.
    if (Attribute block = w->getAttr("moe.int8_block"))
      declared.getDefiningOp()->setAttr("moe.int8_block", block);
    return declared;
  }

  LogicalResult lower(func::FuncOp fn, int64_t stage) {
    if (moe::awaitsCollective(fn))
      return fn.emitError("moe-lower-to-exec: @")
             << fn.getSymName()
             << " takes or gives values of another stage that no send / recv implements "
                "(run moe-insert-collectives)";
    auto rows = fn->getAttrOfType<DenseI64ArrayAttr>("moe.buffer_rows");
    auto widths = fn->getAttrOfType<DenseI64ArrayAttr>("moe.buffer_widths");
    auto types = fn->getAttrOfType<ArrayAttr>("moe.buffer_types");
    auto argBuffers = fn->getAttrOfType<DenseI64ArrayAttr>("moe.arg_buffers");
    if (!rows || !widths || !types || !argBuffers)
      return fn.emitError("moe-lower-to-exec: @")
             << fn.getSymName() << " has no assigned buffers (run moe-assign-buffers)";
    // A training program (moe-append-loss) also takes its labels and
    // returns its loss.
    // (A pipelined one's stage is a forward program, "train_forward", and
    // a backward one, "train", which also take or give the values kept
    // between them: moe.stash, states "stash:<i>".)
    auto entry = fn->getAttrOfType<StringAttr>("moe.entry");
    const bool training =
        entry && (entry.getValue() == "train" || entry.getValue() == "train_forward");
    const unsigned arguments = training ? 3 : 2;
    auto stashOf = [&](DictionaryAttr attrs) -> std::optional<int64_t> {
      auto i = attrs ? attrs.getAs<IntegerAttr>(moe::kStashAttr) : IntegerAttr();
      return i ? std::optional<int64_t>(i.getInt()) : std::nullopt;
    };
    DenseMap<int64_t, int64_t> stashBuffers; // buffer id -> stash index
    for (unsigned i = arguments; i < fn.getNumArguments(); ++i)
      if (auto stash = stashOf(fn.getArgAttrDict(i)); stash && i < argBuffers.size())
        stashBuffers[argBuffers[i]] = *stash;
    if (argBuffers.size() != fn.getNumArguments() ||
        fn.getNumArguments() != arguments + stashBuffers.size())
      return fn.emitError("moe-lower-to-exec: expected the arguments tokens and positions")
             << (training ? " and labels" : "") << " (and values kept on the rank)";
    Block &body = fn.getBody().front();
    auto ret = cast<func::ReturnOp>(body.getTerminator());
    for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
      std::optional<int64_t> stash = stashOf(fn.getResultAttrDict(i));
      if (!stash)
        continue;
      Value v = ret.getOperand(i);
      int64_t id = -1;
      if (auto arg = dyn_cast<BlockArgument>(v)) {
        id = argBuffers[arg.getArgNumber()];
      } else if (auto ids = v.getDefiningOp()->getAttrOfType<DenseI64ArrayAttr>("moe.buffers")) {
        id = ids[cast<OpResult>(v).getResultNumber()];
      }
      if (id < 0 || !stashBuffers.try_emplace(id, *stash).second)
        return fn.emitError("moe-lower-to-exec: kept value ")
               << *stash << " has no buffer of its own";
    }

    OpBuilder b(fn);
    auto program = b.create<exec::ProgramOp>(fn.getLoc(), fn.getSymName(),
                                             entry ? entry.getValue() : "forward", stage);
    Block *block = new Block();
    program.getBody().push_back(block);
    b.setInsertionPointToStart(block);

    // Buffers, in id order (activations in f32, ids and counts in i32).
    auto bufferType = b.getType<exec::BufferType>();
    SmallVector<Value> buffer;
    for (auto [id, r, width, type] :
         llvm::enumerate(rows.asArrayRef(), widths.asArrayRef(), types)) {
      Type element = cast<TypeAttr>(type).getValue();
      element = element.isInteger(32) ? element : b.getF32Type();
      auto stash = stashBuffers.find(int64_t(id));
      buffer.push_back(b.create<exec::BufferOp>(fn.getLoc(), bufferType, element,
                                                r < 0 ? maxTokens : r, width,
                                                stash == stashBuffers.end()
                                                    ? StringAttr()
                                                    : b.getStringAttr(
                                                          "stash:" + Twine(stash->second)),
                                                /*logical_rows=*/IntegerAttr(),
                                                /*shard_group=*/StringAttr()));
    }
    auto bufferId = [&](int64_t id) -> FailureOr<Value> {
      if (id < 0 || id >= int64_t(buffer.size()))
        return failure();
      return buffer[id];
    };

    // Weights, in the order the ops first bind them (moert checks it: a
    // weight id swapped for another of the same shape is then out of order).
    DenseMap<Operation *, Value> weight;
    for (Operation &op : body) {
      if (isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp, func::ReturnOp>(op))
        continue;
      for (Value operand : op.getOperands()) {
        Operation *w = weightOf(operand);
        if (!w || weight.count(w))
          continue;
        weight[w] = declareWeight(b, w);
      }
    }
    // A pipeline stage's backward program, whose ops only read weights,
    // declares its forward program's, in their order (the entries of a
    // stage declare the same): those its ops read, and the others (the
    // embedding's table, whose gradient reads only the token ids; a
    // routing's correction bias).
    func::FuncOp forwardOfStage = moe::pipelineForwardOf(fn);
    if (forwardOfStage) {
      llvm::StringMap<int64_t> order;
      llvm::StringSet<> declared;
      for (auto &[op, value] : weight)
        declared.insert(cast<moe::WeightOpInterface>(op).getTensorName());
      for (Operation &op : forwardOfStage.getBody().front())
        for (Value operand : op.getOperands())
          if (Operation *w = weightOf(operand)) {
            StringRef name = cast<moe::WeightOpInterface>(w).getTensorName();
            order.try_emplace(name, order.size());
            if (declared.insert(name).second)
              declareWeight(b, w);
          }
      SmallVector<exec::WeightOp> all(block->getOps<exec::WeightOp>());
      auto at = [&](exec::WeightOp w) {
        auto it = order.find(w.getTensor());
        return it == order.end() ? INT64_MAX : it->second;
      };
      llvm::stable_sort(all, [&](exec::WeightOp a, exec::WeightOp b) { return at(a) < at(b); });
      for (exec::WeightOp w : all)
        w->moveBefore(block, block->end());
    }
    for (Operation &op : body)
      if (isa<moe::WeightOp, moe::ExpertWeightOp>(op) && !weight.count(&op))
        return op.emitError("moe-lower-to-exec: @")
               << fn.getSymName() << ": weight '"
               << cast<moe::WeightOpInterface>(op).getTensorName() << "' is bound by no op";

    // KV caches, in the order of their ids (a pipeline stage's backward
    // program declares its forward program's: the entries of a stage share
    // them).
    int64_t caches = 0;
    for (Operation &op : forwardOfStage ? forwardOfStage.getBody().front() : body) {
      auto kv = op.getAttrOfType<IntegerAttr>("moe.kv_cache");
      if (!kv || (op.hasAttr("moe.recomputes_cache_of") && kv.getInt() < caches))
        continue;
      if (kv.getInt() != caches)
        return op.emitError("moe-lower-to-exec: expected KV cache ")
               << caches << " here, got " << kv.getInt();
      ++caches;
      int64_t keyWidth, valueWidth;
      if (auto a = dyn_cast<moe::AttentionOp>(op)) {
        keyWidth = a.getKey().getType().getDimSize(1);
        valueWidth = a.getValue().getType().getDimSize(1);
      } else if (auto m = dyn_cast<moe::MLAttentionOp>(op)) {
        keyWidth = m.getNumHeads() * (m.getNopeHeadDim() + m.getRopeHeadDim());
        valueWidth = m.getNumHeads() * m.getValueHeadDim();
      } else {
        return op.emitError("moe-lower-to-exec: a KV cache on an op that is not attention");
      }
      b.create<exec::KVCacheOp>(op.getLoc(), keyWidth, valueWidth);
    }

    DenseMap<Value, Value> bufferOf;
    for (auto [arg, id] : llvm::zip(body.getArguments(), argBuffers.asArrayRef())) {
      FailureOr<Value> v = bufferId(id);
      if (failed(v))
        return fn.emitError("moe-lower-to-exec: argument buffer ") << id << " is not declared";
      bufferOf[arg] = *v;
    }
    b.create<exec::InputsOp>(fn.getLoc(), bufferOf[body.getArgument(0)],
                             bufferOf[body.getArgument(1)],
                             training ? bufferOf[body.getArgument(2)] : Value(),
                             /*step=*/Value());

    Operation *head = headOf(fn);
    for (Operation &op : body) {
      // Lowering a mark moe-insert-collectives has not replaced would drop
      // its collective (a weight's own annotation stays behind).
      if (moe::awaitsCollective(&op))
        return op.emitError("moe-lower-to-exec: ")
               << (isa<mesh::ShardOp>(op)              ? "a resharding"
                   : op.hasAttr(moe::kGatherAttr) ? "a gather of parts"
                                                  : "an expert exchange")
               << " that no collective implements (run moe-insert-collectives)";
      if (isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op))
        continue;
      if (auto ret = dyn_cast<func::ReturnOp>(op)) {
        // The logits or the loss (none: a pipeline stage's backward
        // program, or a forward one before the last stage), then a
        // differentiated training program's gradients, by weight; the
        // values kept for the backward program are in their states.
        Value result;
        SmallVector<Value> gradients, of;
        for (unsigned i = 0; i < ret.getNumOperands(); ++i) {
          if (stashOf(fn.getResultAttrDict(i)))
            continue;
          auto name = fn.getResultAttrOfType<StringAttr>(i, "moe.gradient_of");
          if (!name) {
            if (result)
              return ret.emitError("moe-lower-to-exec: a second result that is not a gradient");
            result = bufferOf.lookup(ret.getOperand(i));
            continue;
          }
          Value w;
          for (auto declared : block->getOps<exec::WeightOp>())
            if (declared.getTensor() == name.getValue())
              w = declared;
          if (!w || !bufferOf.lookup(ret.getOperand(i)))
            return ret.emitError("moe-lower-to-exec: result ")
                   << i << " is not the gradient of a weight of the program";
          gradients.push_back(bufferOf.lookup(ret.getOperand(i)));
          of.push_back(w);
        }
        b.create<exec::ReturnOp>(ret.getLoc(), training ? Value() : result,
                                 training ? result : Value(), gradients, of,
                                 /*stats=*/Value());
        continue;
      }
      SmallVector<Value> ins, ws, outs;
      for (Value operand : op.getOperands()) {
        if (Operation *w = weightOf(operand))
          ws.push_back(weight[w]);
        else if (Value v = bufferOf.lookup(operand))
          ins.push_back(v);
        else
          return op.emitError("moe-lower-to-exec: an operand has no buffer");
      }
      auto ids = op.getAttrOfType<DenseI64ArrayAttr>("moe.buffers");
      if (!ids && op.getNumResults())
        return op.emitError("moe-lower-to-exec: no assigned buffers (run moe-assign-buffers)");
      if (ids) {
        if (ids.size() != int64_t(op.getNumResults()))
          return op.emitError("moe-lower-to-exec: expected one buffer per result");
        for (auto [result, id] : llvm::zip(op.getResults(), ids.asArrayRef())) {
          FailureOr<Value> v = bufferId(id);
          if (failed(v))
            return op.emitError("moe-lower-to-exec: buffer ") << id << " is not declared";
          bufferOf[result] = *v;
          outs.push_back(*v);
        }
      }
      NamedAttrList constants = kernelConstants(b, &op);
      StringRef name = op.getName().stripDialect();
      if (auto mesh = op.getAttrOfType<FlatSymbolRefAttr>("mesh")) {
        int64_t axis = op.getAttrOfType<IntegerAttr>("axis").getInt();
        b.create<exec::CollectiveOp>(op.getLoc(), b.getStringAttr(name), mesh,
                                     b.getStringAttr(axisName(mesh.getValue(), axis)), ins,
                                     ValueRange{}, outs,
                                     constants.getDictionary(b.getContext()), StringAttr());
        continue;
      }
      if (isa<moe::SendOp, moe::RecvOp>(op)) {
        b.create<exec::CollectiveOp>(op.getLoc(), b.getStringAttr(name), FlatSymbolRefAttr(), StringAttr(), ins,
                                     ValueRange{}, outs, constants.getDictionary(b.getContext()), StringAttr());
        continue;
      }
      if (&op == head)
        constants.set("head", b.getBoolAttr(true));
      b.create<exec::LaunchOp>(op.getLoc(), b.getStringAttr(name), ins, ws, outs,
                               constants.getDictionary(b.getContext()), StringAttr());
    }
    return success();
  }
};

struct LowerToExec : moe::impl::MoELowerToExecBase<LowerToExec> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto workload = module->getAttrOfType<DictionaryAttr>("moe.workload");
    auto maxTokens = workload ? workload.getAs<IntegerAttr>("max_batch_tokens") : IntegerAttr();
    if (!maxTokens) {
      module.emitError("moe-lower-to-exec: expected a module with moe.workload "
                       "(run moe-specialize-workload)");
      return signalPassFailure();
    }
    // The programs: @forward, or one @stage<s> per pipeline stage, in order
    // (a pipelined training program: then its @stage<s>_forward ones).
    SmallVector<func::FuncOp> programs;
    SmallVector<int64_t> stageOf;
    auto forward = module.lookupSymbol<func::FuncOp>("forward");
    if (forward) {
      programs.push_back(forward);
      stageOf.push_back(0);
    } else {
      llvm::StringMap<int64_t> next; // per entry, the next stage
      for (auto fn : module.getOps<func::FuncOp>())
        if (auto stage = fn->getAttrOfType<IntegerAttr>("moe.stage")) {
          auto entry = fn->getAttrOfType<StringAttr>("moe.entry");
          int64_t &expected = next[entry ? entry.getValue() : ""];
          if (stage.getInt() != expected++) {
            fn.emitError("moe-lower-to-exec: expected the stages in order");
            return signalPassFailure();
          }
          programs.push_back(fn);
          stageOf.push_back(stage.getInt());
        }
    }
    if (programs.empty()) {
      module.emitError("moe-lower-to-exec: expected @forward or @stage0.. programs");
      return signalPassFailure();
    }
    for (func::FuncOp fn : programs)
      if (fn.getBody().getBlocks().size() != 1) {
        fn.emitError("moe-lower-to-exec: expected a single-block program");
        return signalPassFailure();
      }
    // The model's whole weights stay on the module for the plan and the
    // planner (moe-partition keeps them when it splits @forward).
    if (forward && !module->hasAttr("moe.logical_weights"))
      module->setAttr("moe.logical_weights", moe::logicalWeightsAttr(forward));
    Lowering lowering{module, maxTokens.getInt()};
    for (auto [stage, fn] : llvm::zip(stageOf, programs))
      if (failed(lowering.lower(fn, stage)))
        return signalPassFailure();
    for (func::FuncOp fn : programs)
      fn.erase();
  }
};

} // namespace
