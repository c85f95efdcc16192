//===- AssignBuffers.cpp - activation buffers by liveness --------*- C++ -*-===//
//
// Activations are [T, width] with T <= max_batch_tokens, so a buffer is a row
// width and an element type; static values (a dispatch buffer [E, C, H], its
// counts [E]) have a fixed row count too. A linear scan over the single
// block of each program (@forward, or the @stage<s> of a partitioned module)
// frees a buffer after its value's last use and hands it to the next value
// that fits, so the plan's activation memory is the peak of live values, not
// their sum.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Transforms/Layout.h"
#include "moe/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Mesh/IR/MeshOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseSet.h"

#include <map>

namespace moe {
#define GEN_PASS_DEF_MOEASSIGNBUFFERS
#include "moe/Transforms/Passes.h.inc"
} // namespace moe

using namespace mlir;

namespace {

/// Ops whose kernels may write their first result over one operand of the
/// same width (they read each element before writing it).
bool mayWriteOverOperand(Operation *op) {
  return isa<moe::AddOp, moe::SigmoidGateOp, moe::RopeOp, moe::RMSNormOp, moe::AddNormOp>(op);
}

/// moe.add_norm whose sum nothing reads (the final norm's): the sum shares
/// the normalised rows' buffer, and the backends store only those (a step
/// whose two outputs are one buffer).
bool hasDeadSum(Operation *op) {
  auto addNorm = dyn_cast<moe::AddNormOp>(op);
  return addNorm && addNorm.getSum().use_empty();
}

/// kPerToken rows: max_batch_tokens (the value's leading dimension is T).
constexpr int64_t kPerToken = -1;

struct Buffer {
  int64_t rows, width;
  Type element;
};

class Assigner {
public:
  explicit Assigner(func::FuncOp func) : func(func) {}

  LogicalResult run() {
    // Last use of each value, by op index.
    Block &body = func.getBody().front();
    DenseMap<Operation *, int64_t> index;
    int64_t i = 0;
    for (Operation &op : body)
      index[&op] = i++;
    for (Operation &op : body)
      for (Value operand : op.getOperands())
        lastUse[operand] = std::max(lastUse.lookup(operand), index[&op]);

    // A pipeline stage's values kept for its backward program (results
    // marked moe.stash) hold buffers of their own: those are states of the
    // stage's programs, which no other value may use before them either.
    auto ret = dyn_cast<func::ReturnOp>(body.getTerminator());
    for (unsigned i = 0; ret && i < ret.getNumOperands(); ++i)
      if (func.getResultAttr(i, moe::kStashAttr))
        keptResults.insert(ret.getOperand(i));

    Builder b(func.getContext());
    SmallVector<int64_t> argBuffers;
    for (BlockArgument arg : body.getArguments())
      argBuffers.push_back(allocate(arg));
    func->setAttr("moe.arg_buffers", b.getDenseI64ArrayAttr(argBuffers));

    int64_t caches = 0;
    // (A pipeline stage's backward function recomputes the attentions of
    // its forward function, whose caches they write.)
    const int64_t forwardCaches = cachesOfForwardFunction();
    for (Operation &op : body) {
      // Weights, and their sharding annotations, are not activations.
      if (isa<moe::WeightOp, moe::ExpertWeightOp, mesh::ShardOp>(op))
        continue;
      if (isa<moe::AttentionOp, moe::MLAttentionOp>(op)) {
        // A recomputed attention (moe-recompute-layers) writes its
        // original's cache again, with the same keys and values.
        auto of = op.getAttrOfType<IntegerAttr>("moe.recomputes_cache_of");
        if (of && (of.getInt() < 0 || of.getInt() >= std::max(caches, forwardCaches)))
          return op.emitOpError("recomputes KV cache ")
                 << of.getInt() << " of " << std::max(caches, forwardCaches);
        op.setAttr("moe.kv_cache", of ? of : b.getI64IntegerAttr(caches++));
      }
      int64_t at = index[&op];
      std::optional<int64_t> reused;
      if (mayWriteOverOperand(&op) && !keptResults.contains(op.getResult(0))) {
        for (Value operand : op.getOperands()) {
          auto found = bufferOf.find(operand);
          if (found != bufferOf.end() && lastUse[operand] == at && !isKept(operand) &&
              operand.getType() == op.getResult(0).getType() &&
              !isFree(found->second)) {
            reused = found->second;
            break;
          }
        }
      }
      SmallVector<int64_t> ids;
      if (hasDeadSum(&op)) {
        int64_t id = reused ? *reused : allocate(op.getResult(1));
        bufferOf[op.getResult(0)] = bufferOf[op.getResult(1)] = id;
        ids = {id, id};
      } else {
        for (Value result : op.getResults()) {
          if (!isa<RankedTensorType>(result.getType()))
            continue;
          int64_t id = reused && ids.empty() ? *reused : allocate(result);
          bufferOf[result] = id;
          ids.push_back(id);
        }
      }
      if (!ids.empty())
        op.setAttr("moe.buffers", b.getDenseI64ArrayAttr(ids));
      if (ids.size() != op.getNumResults()) {
        op.emitOpError("has a result that is not a ranked tensor");
        return failure();
      }
      // Operands whose life ends here give their buffers back (the reused
      // one now belongs to the result).
      for (Value operand : op.getOperands()) {
        auto found = bufferOf.find(operand);
        if (found == bufferOf.end() || lastUse[operand] != at)
          continue;
        if (reused && found->second == *reused)
          continue;
        // (A pipeline stage's kept value stays its own: its buffer is a
        // state of the stage's programs, which no other value shares.)
        if (isKept(operand))
          continue;
        release(found->second);
      }
      // A result nobody reads is dead right away (but keep the return value).
      for (Value result : op.getResults())
        if (bufferOf.count(result) && result.use_empty() && !hasDeadSum(&op))
          release(bufferOf[result]);
    }

    SmallVector<int64_t> rows, widths;
    SmallVector<Attribute> types;
    for (const Buffer &buffer : buffers) {
      rows.push_back(buffer.rows);
      widths.push_back(buffer.width);
      types.push_back(TypeAttr::get(buffer.element));
    }
    func->setAttr("moe.buffer_rows", b.getDenseI64ArrayAttr(rows));
    func->setAttr("moe.buffer_widths", b.getDenseI64ArrayAttr(widths));
    func->setAttr("moe.buffer_types", b.getArrayAttr(types));
    return success();
  }

private:
  /// The attentions of the forward function (entry "train_forward") of
  /// the same pipeline stage as this backward one (entry "train"), else 0.
  int64_t cachesOfForwardFunction() {
    int64_t n = 0;
    if (func::FuncOp forward = moe::pipelineForwardOf(func))
      forward.walk([&](Operation *op) {
        n += isa<moe::AttentionOp, moe::MLAttentionOp>(op) && !op->hasAttr("moe.recomputed");
      });
    return n;
  }

  /// (rows, width) of a value: [T] and [T, w] are per-token rows; a static
  /// [n] is one row of n, a static [a, ..., w] a x ... rows of w.
  static std::pair<int64_t, int64_t> shapeOf(Value v) {
    auto type = cast<RankedTensorType>(v.getType());
    ArrayRef<int64_t> shape = type.getShape();
    if (ShapedType::isDynamic(shape[0]))
      return {kPerToken, shape.size() == 1 ? 1 : shape.back()};
    if (shape.size() == 1)
      return {1, shape[0]};
    int64_t rows = 1;
    for (int64_t d : shape.drop_back())
      rows *= d;
    return {rows, shape.back()};
  }

  /// A pipeline stage's value kept from its forward program (moe.stash).
  bool isKept(Value v) {
    auto arg = dyn_cast<BlockArgument>(v);
    return arg && func.getArgAttr(arg.getArgNumber(), moe::kStashAttr);
  }

  bool isFree(int64_t id) const {
    return llvm::any_of(freeList, [&](int64_t f) { return f == id; });
  }

  /// A free buffer of exactly the value's row width and element type, else
  /// a new one. Exact widths keep a buffer's width the row stride of every
  /// value it holds, which the plan's consumers rely on; the layers of a
  /// model repeat the same widths, so little is lost.
  int64_t allocate(Value v) {
    auto [rows, width] = shapeOf(v);
    Type element = cast<RankedTensorType>(v.getType()).getElementType();
    int64_t best = -1;
    for (int64_t id : keptResults.contains(v) ? std::vector<int64_t>() : freeList) {
      const Buffer &buffer = buffers[id];
      if (buffer.element == element && buffer.width == width && buffer.rows == rows) {
        best = id;
        break;
      }
    }
    if (best >= 0) {
      llvm::erase(freeList, best);
    } else {
      best = static_cast<int64_t>(buffers.size());
      buffers.push_back({rows, width, element});
    }
    bufferOf[v] = best;
    return best;
  }

  void release(int64_t id) {
    if (!isFree(id))
      freeList.push_back(id);
  }

  func::FuncOp func;
  llvm::DenseSet<Value> keptResults;
  DenseMap<Value, int64_t> lastUse;
  DenseMap<Value, int64_t> bufferOf;
  std::vector<Buffer> buffers;
  std::vector<int64_t> freeList;
};

struct AssignBuffers : moe::impl::MoEAssignBuffersBase<AssignBuffers> {
  void runOnOperation() override {
    int64_t programs = 0;
    for (auto fn : getOperation().getOps<func::FuncOp>()) {
      if (fn.isExternal())
        continue;
      if (fn.getBody().getBlocks().size() != 1) {
        fn.emitError("expected a single-block program");
        return signalPassFailure();
      }
      if (failed(Assigner(fn).run()))
        return signalPassFailure();
      ++programs;
    }
    if (!programs) {
      getOperation().emitError("expected func.func @forward or the @stage<s> "
                               "programs of a partitioned module");
      return signalPassFailure();
    }
  }
};

} // namespace
