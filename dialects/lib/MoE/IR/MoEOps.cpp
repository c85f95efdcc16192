//===- MoEOps.cpp - verifiers and asm names of moe ops ----------*- C++ -*-===//
//
// Invariants that ODS cannot express are checked here, once; passes rely on
// them. Messages say what was expected and what was found.
//
//===----------------------------------------------------------------------===//
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir;
using namespace moe;

namespace {
int64_t dim(Value v, unsigned i) {
  return cast<RankedTensorType>(v.getType()).getDimSize(i);
}
bool known(int64_t size) { return !ShapedType::isDynamic(size); }
/// A size for messages: "?" when dynamic.
std::string sz(int64_t size) {
  return known(size) ? std::to_string(size) : std::string("?");
}
/// True when both sizes are static and differ.
bool mismatch(int64_t a, int64_t b) { return known(a) && known(b) && a != b; }

/// The SSA name of a weight: its checkpoint name without `model.`, `.weight`
/// and the `{e}` placeholder.
std::string weightAsmName(StringRef name) {
  name.consume_front("model.");
  name.consume_back(".weight");
  std::string result = name.str();
  size_t at = result.find(".{e}");
  if (at != std::string::npos)
    result.erase(at, 4);
  return result;
}

LogicalResult verifyStaticWeight(Operation *op, RankedTensorType type,
                                 StringRef name) {
  if (name.empty())
    return op->emitOpError("expected a non-empty checkpoint tensor name");
  if (!type.hasStaticShape())
    return op->emitOpError("expected a static shape for weight '")
           << name << "' but got " << type;
  if (llvm::any_of(type.getShape(), [](int64_t d) { return d <= 0; }))
    return op->emitOpError("expected every dimension of weight '")
           << name << "' to be > 0 but got " << type;
  return success();
}
} // namespace

//===----------------------------------------------------------------------===//
// Weights
//===----------------------------------------------------------------------===//

void WeightOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), weightAsmName(getName()));
}

/// A layer index is never negative.
static LogicalResult verifyLayer(Operation *op, std::optional<int64_t> layer) {
  if (layer && *layer < 0)
    return op->emitOpError("expected a decoder layer >= 0 but got ") << *layer;
  return success();
}

LogicalResult WeightOp::verify() {
  if (getName().contains("{e}"))
    return emitOpError("expected a plain tensor name; '{e}' belongs to "
                       "moe.expert_weight but got '")
           << getName() << "'";
  WeightRole role = getWeightRole();
  if (role == WeightRole::experts)
    return emitOpError("expected role 'experts' only on moe.expert_weight");
  if (role == WeightRole::row && getType().getRank() != 2)
    return emitOpError("expected a matrix for a row-parallel weight but got ") << getType();
  if (failed(verifyLayer(*this, getLayer())))
    return failure();
  return verifyStaticWeight(*this, getType(), getName());
}

StringRef WeightOp::getTensorName() { return getName(); }
WeightRole WeightOp::getWeightRole() { return getRole().value_or(WeightRole::replicated); }
std::optional<int64_t> WeightOp::getDecoderLayer() { return getLayer(); }

void ExpertWeightOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), weightAsmName(getName()));
}

std::string ExpertWeightOp::getExpertTensorName(int64_t expert) {
  std::string name = getName().str();
  size_t at = name.find("{e}");
  return name.replace(at, 3, std::to_string(expert));
}

LogicalResult ExpertWeightOp::verify() {
  StringRef name = getName();
  size_t first = name.find("{e}");
  if (first == StringRef::npos || name.find("{e}", first + 1) != StringRef::npos)
    return emitOpError("expected exactly one '{e}' placeholder in '")
           << name << "'";
  if (getEtpDim() && *getEtpDim() != 0 && *getEtpDim() != 1)
    return emitOpError("expected etp_dim 0 (an expert's output rows) or 1 (its input "
                       "columns) but got ")
           << *getEtpDim();
  if (failed(verifyLayer(*this, getLayer())))
    return failure();
  return verifyStaticWeight(*this, getType(), name);
}

StringRef ExpertWeightOp::getTensorName() { return getName(); }
WeightRole ExpertWeightOp::getWeightRole() { return WeightRole::experts; }
std::optional<int64_t> ExpertWeightOp::getDecoderLayer() { return getLayer(); }

//===----------------------------------------------------------------------===//
// Embedding, norms, linear maps
//===----------------------------------------------------------------------===//

void EmbeddingOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "embed");
}

LogicalResult EmbeddingOp::verify() {
  if (mismatch(dim(getResult(), 1), dim(getTable(), 1)))
    return emitOpError("expected result width ")
           << dim(getTable(), 1) << " (the table's) but got "
           << dim(getResult(), 1);
  if (mismatch(dim(getResult(), 0), dim(getTokens(), 0)))
    return emitOpError("expected one row per token (")
           << dim(getTokens(), 0) << ") but got " << dim(getResult(), 0);
  return success();
}

static LogicalResult verifyNormWidth(Operation *op, Value input, Value weight,
                                     double epsilon) {
  int64_t width = dim(input, 1), n = dim(weight, 0);
  if (known(width) && known(n) && width % n != 0)
    return op->emitOpError("expected the weight size ")
           << n << " to divide the input width " << width;
  if (!(epsilon > 0))
    return op->emitOpError("expected epsilon > 0 but got ") << epsilon;
  return success();
}

void RMSNormOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "norm");
}
LogicalResult RMSNormOp::verify() {
  if (failed(verifyNormWidth(*this, getInput(), getWeight(), getEpsilon().convertToDouble())))
    return failure();
  // A part of rows that tensor parallelism splits: the whole row's sum of
  // squares, and the part's weight.
  if (Value squares = getSumSquares()) {
    auto type = cast<RankedTensorType>(squares.getType());
    if (!type.getElementType().isF32() || mismatch(dim(squares, 1), 1))
      return emitOpError("expected sum_squares of [T, 1] f32 but got ") << type;
    if (mismatch(dim(squares, 0), dim(getInput(), 0)))
      return emitOpError("expected sum_squares for each of the input's rows");
    if (mismatch(dim(getWeight(), 0), dim(getInput(), 1)))
      return emitOpError("with sum_squares, expected the weight of the input width ")
             << dim(getInput(), 1) << " but got " << dim(getWeight(), 0);
    auto rowWidth = getRowWidth();
    if (!rowWidth || *rowWidth < 1 ||
        (known(dim(getInput(), 1)) && *rowWidth % dim(getInput(), 1) != 0))
      return emitOpError("with sum_squares, expected row_width: a multiple of the input width");
  } else if (getRowWidth()) {
    return emitOpError("row_width: only with sum_squares");
  }
  return success();
}

void RowSumSquaresOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "squares");
}
LogicalResult RowSumSquaresOp::verify() {
  auto type = cast<RankedTensorType>(getResult().getType());
  if (!type.getElementType().isF32() || mismatch(dim(getResult(), 1), 1))
    return emitOpError("expected a result of [T, 1] f32 but got ") << type;
  if (mismatch(dim(getResult(), 0), dim(getInput(), 0)))
    return emitOpError("expected a result row for each input row");
  return success();
}

void LayerNormOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "norm");
}
/// A layer_norm's weight spans the row; its optional bias has its type.
static LogicalResult verifyLayerNormWeights(Operation *op, Value input, Value weight,
                                            Value bias, StringRef weightKind) {
  if (mismatch(dim(input, 1), dim(weight, 0)))
    return op->emitOpError("expected ")
           << weightKind << " of the input width " << dim(input, 1) << " but got "
           << dim(weight, 0);
  if (bias && bias.getType() != weight.getType())
    return op->emitOpError("expected the bias type ")
           << weight.getType() << " but got " << bias.getType();
  return success();
}

LogicalResult LayerNormOp::verify() {
  if (failed(verifyLayerNormWeights(*this, getInput(), getWeight(), getBias(), "a weight")))
    return failure();
  return verifyNormWidth(*this, getInput(), getWeight(),
                         getEpsilon().convertToDouble());
}

void AddNormOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getSum(), "h");
  setName(getResult(), "norm");
}
LogicalResult AddNormOp::verify() {
  if (getLayer()) {
    if (failed(verifyLayerNormWeights(*this, getLhs(), getWeight(), getBias(),
                                      "a layer_norm weight")))
      return failure();
  } else if (getBias()) {
    return emitOpError("expected no bias for an rms_norm (only `layer` has one)");
  }
  return verifyNormWidth(*this, getLhs(), getWeight(), getEpsilon().convertToDouble());
}

void LinearOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  // Named after the weight's module: `%q_proj = moe.linear %x, %...q_proj`.
  StringRef name = "proj";
  Value source = getWeight();
  // Look through a sharding annotation (mesh.shard) to the weight.
  if (Operation *def = source.getDefiningOp();
      def && def->getName().getStringRef() == "mesh.shard")
    source = def->getOperand(0);
  if (auto weight = source.getDefiningOp<WeightOp>()) {
    StringRef module = weight.getName();
    module.consume_back(".weight");
    name = module.rsplit('.').second.empty() ? module : module.rsplit('.').second;
  }
  setName(getResult(), name == "lm_head" || name == "embed_tokens" ? "logits" : name);
}
LogicalResult LinearOp::verify() {
  if (mismatch(dim(getInput(), 1), dim(getWeight(), 1)))
    return emitOpError("expected input width ")
           << dim(getWeight(), 1) << " (weight dim 1) but got "
           << dim(getInput(), 1);
  if (mismatch(dim(getResult(), 1), dim(getWeight(), 0)))
    return emitOpError("expected result width ")
           << dim(getWeight(), 0) << " (weight dim 0) but got "
           << dim(getResult(), 1);
  if (mismatch(dim(getResult(), 0), dim(getInput(), 0)))
    return emitOpError("expected ") << dim(getInput(), 0)
           << " result rows (one per input row) but got " << dim(getResult(), 0);
  if (getBias() && mismatch(dim(getBias(), 0), dim(getWeight(), 0)))
    return emitOpError("expected a bias of size ")
           << dim(getWeight(), 0) << " but got " << dim(getBias(), 0);
  return success();
}

void SplitOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  for (Value result : getResults())
    setName(result, "part");
}

LogicalResult SplitOp::verify() {
  if (getResults().empty())
    return emitOpError("expected at least one result");
  int64_t total = 0;
  for (Value result : getResults()) {
    if (!known(dim(result, 1)))
      return emitOpError("expected static result widths");
    if (mismatch(dim(result, 0), dim(getInput(), 0)))
      return emitOpError("expected every result to keep the ")
             << dim(getInput(), 0) << " input rows";
    total += dim(result, 1);
  }
  if (mismatch(total, dim(getInput(), 1)))
    return emitOpError("expected result widths to add up to ")
           << dim(getInput(), 1) << " but they add up to " << total;
  return success();
}

void ConcatOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "joined");
}
LogicalResult ConcatOp::verify() {
  if (getInputs().empty())
    return emitOpError("expected at least one input");
  Type element = getResult().getType().getElementType();
  int64_t total = 0;
  for (Value input : getInputs()) {
    if (!known(dim(input, 1)))
      return emitOpError("expected static input widths");
    if (cast<RankedTensorType>(input.getType()).getElementType() != element)
      return emitOpError("expected every input in the result's element type ") << element;
    if (mismatch(dim(input, 0), dim(getResult(), 0)))
      return emitOpError("expected every input to have the ")
             << sz(dim(getResult(), 0)) << " result rows";
    total += dim(input, 1);
  }
  if (mismatch(total, dim(getResult(), 1)))
    return emitOpError("expected a result width of ")
           << total << " (the inputs' widths added up) but got " << dim(getResult(), 1);
  return success();
}

void AddOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "residual");
}

void SigmoidGateOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "gated");
}
LogicalResult SigmoidGateOp::verify() {
  if (dim(getGate(), 1) != 1)
    return emitOpError("expected a [T, 1] gate but got width ")
           << sz(dim(getGate(), 1));
  if (mismatch(dim(getGate(), 0), dim(getInput(), 0)))
    return emitOpError("expected one gate per input row");
  return success();
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

void RopeOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "rot");
}
LogicalResult RopeOp::verify() {
  int64_t headDim = getHeadDim(), width = dim(getInput(), 1);
  if (headDim <= 0)
    return emitOpError("expected head_dim > 0 but got ") << headDim;
  if (known(width) && width % headDim != 0)
    return emitOpError("expected head_dim ")
           << headDim << " to divide the input width " << width;
  if (getRope().getRotaryDim() > headDim)
    return emitOpError("expected rotary_dim <= head_dim ")
           << headDim << " but got " << getRope().getRotaryDim();
  if (mismatch(dim(getPositions(), 0), dim(getInput(), 0)))
    return emitOpError("expected one position per token");
  return success();
}

/// Checks that `value` holds `heads` heads of a whole width and returns it.
static FailureOr<int64_t> headWidth(Operation *op, Value value, int64_t heads,
                                    StringRef what) {
  int64_t width = dim(value, 1);
  if (!known(width))
    return op->emitOpError("expected a static ") << what << " width";
  if (width % heads != 0)
    return op->emitOpError("expected the ")
           << what << " width " << width << " to be a multiple of " << heads
           << " heads";
  return width / heads;
}

void AttentionOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "attn");
}
LogicalResult AttentionOp::verify() {
  int64_t heads = getNumHeads(), kvHeads = getNumKvHeads();
  if (heads <= 0 || kvHeads <= 0 || heads % kvHeads != 0)
    return emitOpError("expected num_kv_heads to divide num_heads but got ")
           << kvHeads << " and " << heads;
  FailureOr<int64_t> qDim = headWidth(*this, getQuery(), heads, "query");
  FailureOr<int64_t> kDim = headWidth(*this, getKey(), kvHeads, "key");
  FailureOr<int64_t> vDim = headWidth(*this, getValue(), kvHeads, "value");
  if (failed(qDim) || failed(kDim) || failed(vDim))
    return failure();
  if (*qDim != *kDim)
    return emitOpError("expected query and key head dims to match but got ")
           << *qDim << " and " << *kDim;
  if (mismatch(dim(getResult(), 1), heads * *vDim))
    return emitOpError("expected result width ")
           << heads * *vDim << " (heads x value head dim) but got "
           << dim(getResult(), 1);
  if (!(getScale().convertToDouble() > 0))
    return emitOpError("expected scale > 0");
  if (getSlidingWindow() && *getSlidingWindow() <= 0)
    return emitOpError("expected sliding_window > 0 but got ")
           << *getSlidingWindow();
  return success();
}

void MLAttentionOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "attn");
}
LogicalResult MLAttentionOp::verify() {
  int64_t heads = getNumHeads();
  if (heads <= 0)
    return emitOpError("expected num_heads > 0 but got ") << heads;
  FailureOr<int64_t> qDim = headWidth(*this, getQuery(), heads, "query");
  FailureOr<int64_t> kvDim = headWidth(*this, getKv(), heads, "kv");
  if (failed(qDim) || failed(kvDim))
    return failure();
  int64_t ropeDim = getRopeHeadDim();
  if (!known(ropeDim))
    return emitOpError("expected a static key_rope width");
  if (ropeDim != getRope().getRotaryDim())
    return emitOpError("expected rotary_dim ")
           << ropeDim << " (the key_rope width) but got "
           << getRope().getRotaryDim();
  int64_t nope = *qDim - ropeDim;
  if (nope <= 0)
    return emitOpError("expected a query head dim ")
           << *qDim << " larger than the rotary dim " << ropeDim;
  if (*kvDim <= nope)
    return emitOpError("expected a kv head dim ")
           << *kvDim << " larger than the nope dim " << nope;
  if (mismatch(dim(getResult(), 1), heads * (*kvDim - nope)))
    return emitOpError("expected result width ")
           << heads * (*kvDim - nope) << " but got " << dim(getResult(), 1);
  if (!(getScale().convertToDouble() > 0))
    return emitOpError("expected scale > 0");
  return success();
}

//===----------------------------------------------------------------------===//
// Feed-forward
//===----------------------------------------------------------------------===//

/// Checks gate/up [I, H] and down [H, I] against a hidden width.
static LogicalResult verifyMLPShapes(Operation *op, int64_t hidden,
                                     ArrayRef<int64_t> gate,
                                     ArrayRef<int64_t> up,
                                     ArrayRef<int64_t> down) {
  if (gate != up)
    return op->emitOpError("expected gate and up weights of the same shape");
  int64_t inter = gate[0];
  if (mismatch(gate[1], hidden))
    return op->emitOpError("expected gate/up weights [")
           << inter << ", " << hidden << "] but got [" << gate[0] << ", "
           << gate[1] << "]";
  if (mismatch(down[0], hidden) || mismatch(down[1], inter))
    return op->emitOpError("expected a down weight [")
           << sz(hidden) << ", " << sz(inter) << "] but got [" << sz(down[0])
           << ", " << sz(down[1]) << "]";
  return success();
}

void MLPOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "mlp");
}
LogicalResult MLPOp::verify() {
  return verifyMLPShapes(*this, dim(getInput(), 1),
                         getGateWeight().getType().getShape(),
                         getUpWeight().getType().getShape(),
                         getDownWeight().getType().getShape());
}

void RouterOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getWeights(), "routing_weights");
  setName(getExperts(), "selected_experts");
}
/// The checks moe.router and moe.route share: the routing against the
/// number of experts, the results, the correction bias.
static LogicalResult verifyRouting(Operation *op, RoutingAttr routing, int64_t numExperts,
                                   Value weights, Value experts, Value bias) {
  int64_t k = routing.getTopK();
  if (k > numExperts)
    return op->emitOpError("expected top_k <= ") << numExperts << " experts but got " << k;
  if (dim(weights, 1) != k || dim(experts, 1) != k)
    return op->emitOpError("expected [T, ")
           << k << "] weights and experts but got widths " << dim(weights, 1) << " and "
           << dim(experts, 1);
  if (cast<RankedTensorType>(weights.getType()).getElementType() != routing.getComputeType())
    return op->emitOpError("expected weights in the compute type ") << routing.getComputeType();
  int64_t groups = routing.getNumGroups();
  if (numExperts % groups != 0)
    return op->emitOpError("expected num_groups ")
           << groups << " to divide the " << numExperts << " experts";
  if (groups > 1 && routing.getTopkGroups() * (numExperts / groups) < k)
    return op->emitOpError("expected the ")
           << routing.getTopkGroups() << " kept groups of " << numExperts / groups
           << " experts to hold top_k = " << k;
  if (groups > 1 && routing.getGroupScore() == GroupScore::top2_sum && numExperts / groups < 2)
    return op->emitOpError("expected at least 2 experts per group for top2_sum");
  if (bias && dim(bias, 0) != numExperts)
    return op->emitOpError("expected a correction bias of ")
           << numExperts << " values but got " << sz(dim(bias, 0));
  return success();
}

LogicalResult RouterOp::verify() {
  if (!getGateWeight().getType().hasStaticShape())
    return emitOpError("expected a static gate weight shape but got ")
           << getGateWeight().getType();
  if (mismatch(dim(getInput(), 1), dim(getGateWeight(), 1)))
    return emitOpError("expected a gate weight of width ")
           << dim(getInput(), 1) << " but got " << dim(getGateWeight(), 1);
  return verifyRouting(*this, getRouting(), getNumExperts(), getWeights(), getExperts(),
                       getCorrectionBias());
}

void RouteOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getWeights(), "routing_weights");
  setName(getExperts(), "selected_experts");
}
LogicalResult RouteOp::verify() {
  if (ShapedType::isDynamic(getNumExperts()))
    return emitOpError("expected logits of a static number of experts but got ")
           << getLogits().getType();
  if (getLogits().getType().getElementType() != getRouting().getComputeType())
    return emitOpError("expected logits in the compute type ") << getRouting().getComputeType();
  return verifyRouting(*this, getRouting(), getNumExperts(), getWeights(), getExperts(),
                       getCorrectionBias());
}

void ExpertsOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "moe");
}
LogicalResult moe::verifyExpertsOperands(Operation *op, Value input, Value weights,
                                         Value experts, Value gateWeights, Value upWeights,
                                         Value downWeights) {
  ArrayRef<int64_t> gate = cast<RankedTensorType>(gateWeights.getType()).getShape();
  ArrayRef<int64_t> up = cast<RankedTensorType>(upWeights.getType()).getShape();
  ArrayRef<int64_t> down = cast<RankedTensorType>(downWeights.getType()).getShape();
  if (gate[0] != up[0] || gate[0] != down[0])
    return op->emitOpError("expected the same number of experts in every stack "
                           "but got ")
           << gate[0] << ", " << up[0] << " and " << down[0];
  if (dim(weights, 1) != dim(experts, 1))
    return op->emitOpError("expected weights and experts of the same width");
  if (mismatch(dim(weights, 0), dim(input, 0)) || mismatch(dim(experts, 0), dim(input, 0)))
    return op->emitOpError("expected one routing row per token");
  if (dim(experts, 1) > gate[0])
    return op->emitOpError("expected at most ")
           << gate[0] << " selected experts per token but got " << dim(experts, 1);
  return verifyMLPShapes(op, dim(input, 1), gate.drop_front(), up.drop_front(),
                         down.drop_front());
}

LogicalResult ExpertsOp::verify() {
  return verifyExpertsOperands(*this, getInput(), getWeights(), getExperts(), getGateWeights(),
                               getUpWeights(), getDownWeights());
}

//===----------------------------------------------------------------------===//
// Partitioned programs
//===----------------------------------------------------------------------===//

static LogicalResult verifyAxis(Operation *op, int64_t axis) {
  if (axis < 0 || axis > 3)
    return op->emitOpError("expected a mesh axis in [0, 3] but got ") << axis;
  return success();
}

LogicalResult AllReduceOp::verify() { return verifyAxis(*this, getAxis()); }

LogicalResult AllGatherOp::verify() {
  if (failed(verifyAxis(*this, getAxis())))
    return failure();
  if (mismatch(dim(getInput(), 0), dim(getResult(), 0)))
    return emitOpError("expected as many rows in the result as in the input");
  int64_t in = dim(getInput(), 1), out = dim(getResult(), 1);
  if (known(in) && known(out) && (out < in || out % in))
    return emitOpError("expected a result width that is a multiple of the "
                       "input's (")
           << in << ") but got " << out;
  return success();
}

void DispatchOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getBuffer(), "dispatched");
  setName(getCounts(), "counts");
  setName(getSlots(), "slots");
}

LogicalResult DispatchOp::verify() {
  auto buffer = getBuffer().getType();
  if (!buffer.hasStaticShape() || !getCounts().getType().hasStaticShape())
    return emitOpError("expected static buffer and counts shapes (their "
                       "sizes are known when compiling)");
  if (buffer.getDimSize(1) != getCapacity())
    return emitOpError("expected a buffer of capacity ")
           << getCapacity() << " but got " << buffer;
  if (getCapacity() < 1)
    return emitOpError("expected a capacity >= 1 but got ") << getCapacity();
  if (getCapacityFactor().convertToDouble() < 0)
    return emitOpError("expected a capacity factor >= 0 (0: dropless)");
  if (getCounts().getType().getDimSize(0) != buffer.getDimSize(0))
    return emitOpError("expected one count per expert (")
           << buffer.getDimSize(0) << ") but got " << getCounts().getType();
  if (mismatch(dim(getInput(), 1), buffer.getDimSize(2)))
    return emitOpError("expected buffer rows as wide as the input (")
           << sz(dim(getInput(), 1)) << ") but got " << buffer.getDimSize(2);
  if (mismatch(dim(getExperts(), 0), dim(getInput(), 0)) ||
      getSlots().getType() != getExperts().getType())
    return emitOpError("expected one routing row per token and slots shaped "
                       "like the experts");
  if (getRowParts() < 1 || getRowPartStride() < 1)
    return emitOpError("expected row parts and stride >= 1");
  return success();
}

LogicalResult AllToAllOp::verify() {
  if (failed(verifyAxis(*this, getAxis())))
    return failure();
  if (getCounts().getType().getDimSize(0) != getBuffer().getType().getDimSize(0))
    return emitOpError("expected one count per expert");
  return success();
}

void ExpertFFNOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "expert_out");
}

LogicalResult ExpertFFNOp::verify() {
  ArrayRef<int64_t> gate = getGateWeights().getType().getShape();
  ArrayRef<int64_t> up = getUpWeights().getType().getShape();
  ArrayRef<int64_t> down = getDownWeights().getType().getShape();
  if (gate[0] != up[0] || gate[0] != down[0])
    return emitOpError("expected the same number of experts in every stack");
  int64_t experts = getBuffer().getType().getDimSize(0);
  if (known(experts) && experts % gate[0])
    return emitOpError("expected the buffer's experts (")
           << experts << ") to be a multiple of the local experts (" << gate[0]
           << ")";
  if (getCounts().getType().getDimSize(0) != experts)
    return emitOpError("expected one count per expert");
  return verifyMLPShapes(*this, getBuffer().getType().getDimSize(2),
                         gate.drop_front(), up.drop_front(), down.drop_front());
}

void CombineOp::getAsmResultNames(OpAsmSetValueNameFn setName) {
  setName(getResult(), "moe");
}

LogicalResult CombineOp::verify() {
  if (getSlots().getType().getShape() != getWeights().getType().getShape())
    return emitOpError("expected slots and weights of the same shape");
  if (mismatch(dim(getResult(), 1), getOutputs().getType().getDimSize(2)))
    return emitOpError("expected a result as wide as the expert outputs");
  if (mismatch(dim(getResult(), 0), dim(getSlots(), 0)))
    return emitOpError("expected one row per token");
  return success();
}

#define GET_OP_CLASSES
#include "moe/Dialect/MoE/IR/MoEOps.cpp.inc"
