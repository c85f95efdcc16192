//===- ExecDialect.cpp - the exec dialect -----------------------*- C++ -*-===//
#include "moe/Dialect/Exec/IR/ExecOps.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace moe::exec;

#include "moe/Dialect/Exec/IR/ExecDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "moe/Dialect/Exec/IR/ExecTypes.cpp.inc"

#define GET_OP_CLASSES
#include "moe/Dialect/Exec/IR/ExecOps.cpp.inc"

void ExecDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "moe/Dialect/Exec/IR/ExecTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "moe/Dialect/Exec/IR/ExecOps.cpp.inc"
      >();
}

bool moe::exec::isPlainConstant(Attribute a) {
  if (isa<IntegerAttr, FloatAttr, StringAttr, BoolAttr, UnitAttr>(a))
    return true;
  if (auto array = dyn_cast<ArrayAttr>(a))
    return llvm::all_of(array, isPlainConstant);
  if (auto dict = dyn_cast<DictionaryAttr>(a))
    return llvm::all_of(dict, [](NamedAttribute n) { return isPlainConstant(n.getValue()); });
  return false;
}

static LogicalResult verifyConstants(Operation *op, DictionaryAttr constants) {
  for (NamedAttribute n : constants)
    if (!isPlainConstant(n.getValue()))
      return op->emitOpError("constant '")
             << n.getName().getValue()
             << "' is not an integer, float, string, bool, array or dictionary";
  return success();
}

LogicalResult ProgramOp::verify() {
  if (getEntry().empty())
    return emitOpError("needs an entry name");
  if (getStageAttr().getInt() < 0)
    return emitOpError("stage must be >= 0");
  Dialect *exec = getOperation()->getDialect();
  for (Operation &op : getBody().front())
    if (op.getDialect() != exec)
      return op.emitOpError("cannot appear in an exec.program (lower it to exec ops first)");
  auto inputs = getBody().front().getOps<InputsOp>();
  if (std::distance(inputs.begin(), inputs.end()) > 1)
    return emitOpError("has more than one exec.inputs");
  return success();
}

LogicalResult ReturnOp::verify() {
  if (getGradients().size() != getGradientOf().size())
    return emitOpError("expected one weight per gradient but got ")
           << getGradients().size() << " gradients of " << getGradientOf().size() << " weights";
  return success();
}

LogicalResult InputsOp::verify() {
  // A model program reads tokens and positions (and labels); an optimizer
  // program reads only its step number.
  if (!getTokens() != !getPositions())
    return emitOpError("expected tokens and positions together");
  if (getStep() && (getTokens() || getLabels()))
    return emitOpError("an optimizer program's step is its only input");
  if (!getStep() && !getTokens())
    return emitOpError("expected tokens and positions, or an optimizer's step");
  return success();
}

/// The id the plan gives a declaration: its position among its kind's.
template <typename OpT>
static int64_t declarationId(OpT op) {
  int64_t id = 0;
  for (Operation *prev = op->getPrevNode(); prev; prev = prev->getPrevNode())
    id += isa<OpT>(prev);
  return id;
}

// Printed as %b<id> and %w<id>, the ids of the plan ("buf:3", "weight:2").
void BufferOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), ("b" + llvm::Twine(declarationId(*this))).str());
}
void WeightOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), ("w" + llvm::Twine(declarationId(*this))).str());
}

LogicalResult BufferOp::verify() {
  Type t = getElementType();
  if (!t.isF32() && !t.isInteger(32))
    return emitOpError("element type must be f32 or i32, got ") << t;
  int64_t rows = getRowsAttr().getInt(), width = getWidthAttr().getInt();
  if (rows <= 0 || width <= 0)
    return emitOpError("rows and width must be positive, got ") << rows << " x " << width;
  // (A pipeline stage's kept values, "stash:<i>", may be ids too.)
  if (auto state = getStateAttr();
      state && (state.getValue().empty() ||
                (!t.isF32() && !state.getValue().starts_with("stash:"))))
    return emitOpError("a state buffer needs a name and f32 values");
  if (auto logical = getLogicalRowsAttr()) {
    if (!getStateAttr())
      return emitOpError("logical_rows: only a state buffer is a ZeRO shard");
    if (logical.getInt() < 1)
      return emitOpError("logical_rows must be positive, got ") << logical.getInt();
  }
  if (auto group = getShardGroupAttr()) {
    if (!getLogicalRowsAttr())
      return emitOpError("shard_group: only a ZeRO shard (logical_rows) has one");
    if (group.getValue() != "dp" && group.getValue() != "edp")
      return emitOpError("shard_group '") << group.getValue() << "': expected dp or edp";
  }
  return success();
}

LogicalResult WeightOp::verify() {
  if (getTensor().empty())
    return emitOpError("needs the checkpoint tensor's name");
  auto type = dyn_cast<RankedTensorType>(getTensorType());
  if (!type || !type.hasStaticShape())
    return emitOpError("'") << getTensor() << "' needs a static tensor type, got "
                            << getTensorType();
  Type e = type.getElementType();
  if (!e.isF32() && !e.isBF16() && !e.isF16() && !e.isInteger(32))
    return emitOpError("'") << getTensor() << "': dtype " << e
                            << " is not a checkpoint dtype (f32, bf16, f16, i32)";
  if (auto experts = getExpertsAttr(); experts && experts.getInt() <= 0)
    return emitOpError("'") << getTensor() << "': experts must be positive";
  return success();
}

LogicalResult LaunchOp::verify() {
  if (getKernel().empty())
    return emitOpError("needs a kernel id");
  if (!getKernels().empty() && !getRows())
    return emitOpError("'") << getKernel() << "': a lowered launch needs its rows";
  if (getUpdatesWeights() && getWeights().empty())
    return emitOpError("'") << getKernel() << "': updates_weights without weights";
  if (!getKernels().empty())
    for (Operation &op : getKernels().front())
      if (!isa<DispatchOp, GemmOp>(op))
        return op.emitOpError("cannot appear in a launch's kernels (exec.dispatch or exec.gemm)");
  return verifyConstants(*this, getConstants());
}

LogicalResult DispatchOp::verify() {
  for (ArrayRef<int64_t> dim : {getGridX(), getGridY(), getGridZ()})
    if (dim.size() != 3 || dim[0] < 0 || dim[1] < 1 || dim[2] < 0)
      return emitOpError("'") << getKernel()
                              << "': each grid dimension is [a, d, c] (ceil(a * N / d) + c) "
                                 "with a, c >= 0 and d >= 1";
  int64_t block = getBlockAttr().getInt();
  if (block < 1 || block > 1024)
    return emitOpError("'") << getKernel() << "': block must be in [1, 1024], got " << block;
  if (getSharedBytesAttr().getInt() < 0)
    return emitOpError("'") << getKernel() << "': shared_bytes must be >= 0";
  return success();
}

LogicalResult GemmOp::verify() {
  int64_t n = getNAttr().getInt(), k = getKAttr().getInt(), batch = getBatchAttr().getInt();
  if (n <= 0 || k <= 0 || batch <= 0)
    return emitOpError("n, k and batch must be positive");
  const bool transposeA = getTransposeA().value_or(false);
  if ((!transposeA && getLdaAttr().getInt() < k) || getLdcAttr().getInt() < n)
    return emitOpError("lda must be >= k and ldc >= n");
  if (getLdbAttr().getInt() < (getTransposeB() ? k : n))
    return emitOpError("ldb must be >= k (transpose_b) or n");
  if (auto kRows = getKRows(); kRows && *kRows != "T" && *kRows != "R")
    return emitOpError("k_rows must be \"T\" or \"R\"");
  if (batch > 1 && getKRows())
    return emitOpError("a batched gemm takes no k_rows (its blocks' rows come from counts)");
  if (batch > 1 && (!getStrideA() || !getStrideB() || !getStrideC()))
    return emitOpError("a batched gemm needs stride_a, stride_b and stride_c");
  return success();
}

LogicalResult CollectiveOp::verify() {
  StringRef kind = getKind();
  bool grouped = llvm::StringSwitch<bool>(kind)
                     .Cases("all_reduce", "all_gather", "all_to_all", "reduce_scatter", true)
                     .Default(false);
  bool peer = kind == "send" || kind == "recv";
  if (!grouped && !peer)
    return emitOpError("unknown collective '")
           << kind << "' (expected all_reduce, all_gather, all_to_all, reduce_scatter, send or recv)";
  if (grouped && (!getMesh() || !getAxis()))
    return emitOpError("'") << kind << "' needs its group: over @mesh[\"axis\"]";
  if (peer) {
    if (getMesh())
      return emitOpError("'") << kind << "' names a stage, not a group";
    if (!getConstants().getAs<IntegerAttr>("stage"))
      return emitOpError("'") << kind << "' needs the peer stage (constant 'stage')";
  }
  if (!getWeights().empty()) {
    auto shard = getConstants().getAs<IntegerAttr>("shard_rows");
    if (kind != "all_gather" || getWeights().size() != 1 || !getIns().empty() ||
        !getOuts().empty() || !shard || shard.getInt() < 1)
      return emitOpError("a collective of a weight is an all_gather of one weight in place, "
                         "with its 'shard_rows' (ZeRO)");
  }
  return verifyConstants(*this, getConstants());
}
