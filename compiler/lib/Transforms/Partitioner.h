//===- Partitioner.h - moe-partition's rewriter ------------------*- C++ -*-===//
//
// Internal to moe-partition (Partition.cpp: the model's ops and the stage
// functions; PartitionGradients.cpp: a training program's loss and
// backward ops): the distribution of every rewritten value and the
// rewriting of one op at a time.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"

namespace moe::partition {

using namespace mlir;

constexpr int64_t kTpAxis = 2;  // @mesh: pp x dp x tp
constexpr int64_t kEpAxis = 2;  // @experts: pp x edp x ep x etp
constexpr int64_t kEtpAxis = 3;

enum class Dist { Replicated, Local, Partial };

struct Degrees {
  int64_t dp = 1, pp = 1, tp = 1, ep = 1, etp = 1;
};

/// The weight op (moe.weight / moe.expert_weight) behind a value, through its
/// mesh.shard annotation.
inline Operation *weightOpOf(Value v, mesh::ShardOp *shard = nullptr) {
  Operation *def = v.getDefiningOp();
  if (auto s = dyn_cast_or_null<mesh::ShardOp>(def)) {
    if (shard)
      *shard = s;
    def = s.getSrc().getDefiningOp();
  }
  if (isa_and_nonnull<moe::WeightOp, moe::ExpertWeightOp>(def))
    return def;
  return nullptr;
}

inline StringRef weightName(Operation *op) { return cast<moe::WeightOpInterface>(op).getTensorName(); }

inline RankedTensorType withDim(RankedTensorType t, unsigned dim, int64_t size) {
  SmallVector<int64_t> shape(t.getShape());
  shape[dim] = size;
  return RankedTensorType::get(shape, t.getElementType());
}

class Partitioner {
public:
  Partitioner(ModuleOp module, func::FuncOp forward)
      : module(module), forward(forward),
        b(module.getContext()) {}

  LogicalResult run();

private:
  struct Mapped {
    Value value;
    Dist dist = Dist::Replicated;
    Value replicated; // the all_reduce of a Partial value, once made
  };

  LogicalResult readSharding();
  LogicalResult assignStages(SmallVectorImpl<int64_t> &stageOfOp, Operation *lossOp = nullptr,
                             SmallVectorImpl<bool> *backwardOf = nullptr);
  /// A new function before @forward of the model's inputs (their
  /// attributes, mapped as they are) and `inputs` beyond them, `results`;
  /// the builder at its entry block, the value maps cleared.
  func::FuncOp startFunction(StringRef name, int64_t stage, StringRef entryName,
                             ArrayRef<Type> inputs, ArrayRef<Type> results);
  LogicalResult buildStage(int64_t stage, ArrayRef<int64_t> stageOfOp,
                           ArrayRef<Value> incoming, ArrayRef<Value> outgoing);
  /// PartitionPipeline.cpp: a training program over pp > 1 stages, a
  /// forward and a backward function per stage.
  LogicalResult runPipelined();
  /// The module's logical weights and sizes kept, @forward erased.
  LogicalResult finish();
  /// A value the function takes or gives, with the attribute that says how.
  struct Port {
    Value old;
    StringRef attr;   ///< kRecvFromAttr, kSendToAttr, kStashAttr, or empty
    int64_t value = 0;
  };
  /// Function `name` of `stage` (entry `entry`) of the ops `includes`
  /// selects (by index in @forward), taking the model's inputs and `args`,
  /// giving `results` (a gradient's `moe.gradient_of` copied).
  /// How each value a pipeline function gives travels (its distribution
  /// where it is taken).
  DenseMap<Value, Dist> portDist;
  DenseMap<Value, Type> portType;
  LogicalResult buildFunction(StringRef name, int64_t stage, StringRef entryName,
                              function_ref<bool(int64_t)> includes, ArrayRef<Port> args,
                              ArrayRef<Port> results);
  LogicalResult rewrite(Operation &op);
  LogicalResult expertFFN(moe::ExpertFFNOp op);
  /// PartitionGradients.cpp: a training program's loss and backward ops
  /// (`handled` false for any other op).
  LogicalResult rewriteTraining(Operation &op, bool &handled);
  LogicalResult expertFFNGrad(moe::ExpertFFNGradOp op);
  /// Each rank's statistics of its part of the logits (moe.vocab_stats),
  /// marked to be gathered over tp ([T, 4 tp]).
  Value gatheredVocabStats(Location loc, Value logits, Value labels, IntegerAttr vocab);
  /// An operand of a training op as `want` (Replicated: made whole; Local:
  /// as it is, which must be split; Partial: as it is, whatever it is).
  FailureOr<Value> operandAs(Value old, Operation *user, Dist want);

  /// The rank-local weight for `v` (a weight or its annotation), cloned into
  /// the stage's function once.
  FailureOr<Value> weight(Value v, Operation *user);
  Mapped &get(Value old) { return values[old]; }
  /// The replicated form of an old value: for a partial sum (once), the
  /// annotations that say so, which moe-insert-collectives turns into the
  /// all_reduce over tp.
  FailureOr<Value> replicated(Value old, Operation *user);
  Value wholeOfPartial(Value v) {
    MLIRContext *ctx = b.getContext();
    // Split axes [[]]: not split (an empty list does not print back).
    mesh::MeshAxesAttr none = mesh::MeshAxesAttr::get(ctx, ArrayRef<mesh::MeshAxis>{});
    auto partial = mesh::MeshShardingAttr::get(ctx, meshRef, ArrayRef<mesh::MeshAxesAttr>{none},
                                               ArrayRef<mesh::MeshAxis>{kTpAxis},
                                               mesh::ReductionKind::Sum);
    Value p = b.create<mesh::ShardOp>(v.getLoc(), v, partial);
    auto whole = mesh::MeshShardingAttr::get(ctx, meshRef, ArrayRef<mesh::MeshAxesAttr>{none},
                                             ArrayRef<mesh::MeshAxis>{}, mesh::ReductionKind::Sum);
    return b.create<mesh::ShardOp>(v.getLoc(), p, whole, /*annotate_for_users=*/true);
  }
  void set(Value old, Value now, Dist dist) { values[old] = Mapped{now, dist, {}}; }
  /// A collective's group as moe-insert-collectives reads it.
  DictionaryAttr group(FlatSymbolRefAttr mesh, int64_t axis) {
    return b.getDictionaryAttr(
        {b.getNamedAttr("mesh", mesh), b.getNamedAttr("axis", b.getI64IntegerAttr(axis))});
  }

  ModuleOp module;
  func::FuncOp forward;
  OpBuilder b;
  Degrees d;
  int64_t vocab = 0, paddedVocab = 0;
  SmallVector<int64_t> stageBegin;
  FlatSymbolRefAttr meshRef, expertsRef;
  // Per stage function being built.
  DenseMap<Value, Mapped> values;
  DenseMap<Operation *, Value> weights;
  /// Weights whose vocabulary rows are split over tp (embedding, LM head):
  /// sharded even when a rank's padded part has as many rows as the real
  /// vocabulary (vocab 64 padded to 128 over tp = 2: rank 1 holds padding).
  DenseSet<Operation *> vocabSharded;
  bool isVocabSharded(Value v) {
    Operation *w = weightOpOf(v);
    return w && vocabSharded.contains(w);
  }
  /// The vocabulary-split logits' gathered moe.vocab_stats (the
  /// cross-entropy's, which its gradient reads too), by the old logits.
  DenseMap<Value, Value> vocabStats;
  /// The embedding's table is split by vocabulary rows (its gradient too).
  bool vocabShardedTable = false;
  Block *entry = nullptr;
};


} // namespace moe::partition
