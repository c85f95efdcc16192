// The plan as the runtime sees it: loaded from the JSON manifest written by
// `moec compile` (format documented in docs/plan-format.md) and validated in
// full before use: every id, width and shape is checked, so executing a plan
// that loaded cannot index out of bounds.
#pragma once

#include "moert/Tensor.h"
#include "moert/cpu/Kernels.h"

#include <string>
#include <vector>

namespace moert {

constexpr int kPlanFormatVersion = 1;

struct PlanWeight {
  std::string name; ///< checkpoint name; with "{e}" for an expert stack
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  int64_t experts = 0; ///< > 0: a stack of `experts` per-expert tensors
  int64_t bytes = 0;
  /// The checkpoint name of expert e's tensor.
  std::string expertName(int64_t e) const;
  /// Shape of one checkpoint tensor (without the stack dimension).
  std::vector<int64_t> tensorShape() const;
};

struct PlanBuffer {
  int64_t width = 0;
  DType dtype = DType::F32; ///< F32 or I32
  int64_t bytes = 0;
};

struct PlanCache {
  int64_t keyWidth = 0, valueWidth = 0, bytes = 0;
};

enum class OpKind {
  Embedding, RMSNorm, LayerNorm, Linear, Rope, Attention, MLAttention,
  Split, Add, SigmoidGate, MLP, Router, Experts
};
const char *opName(OpKind op);

/// One step: an op over buffers and weights, with its attributes decoded.
struct PlanStep {
  OpKind op = OpKind::Add;
  std::vector<int64_t> in, weights, out;
  double eps = 0, scale = 0;
  int64_t headDim = 0, heads = 0, kvHeads = 0, slidingWindow = 0, kvCache = -1;
  cpu::RopeParams rope;
  cpu::RoutingParams routing;
  cpu::Activation activation = cpu::Activation::Silu;
  std::vector<int64_t> widths; ///< split
};

struct PlanRank {
  int64_t rank = 0;
  std::vector<PlanBuffer> buffers;
  std::vector<PlanCache> caches;
  int64_t tokensBuffer = 0, positionsBuffer = 0, logitsBuffer = 0;
  std::vector<PlanStep> steps;
  int64_t predictedPeakBytes = 0;
};

struct Plan {
  std::string path;
  std::string modelType;
  int64_t vocabSize = 0, maxPositionEmbeddings = 0;
  std::vector<int64_t> eosTokenIds;
  /// Checkpoint tensors under these prefixes are not part of the model
  /// (e.g. multi-token-prediction layers) and are skipped.
  std::vector<std::string> unusedTensorPrefixes;
  int64_t maxBatchTokens = 0, maxSeqLen = 0, maxSequences = 0;
  int64_t worldSize = 1;
  std::vector<PlanWeight> weights;
  std::vector<PlanRank> ranks;

  /// Reads and validates `path`; InputError naming the plan and the field.
  static Plan load(const std::string &path);
};

class Checkpoint;
/// InputError naming the file and the tensor when the checkpoint holds a
/// tensor that is neither a weight of the plan nor under an unused prefix.
void checkNoUnexpectedTensors(const Plan &plan, const Checkpoint &checkpoint);

} // namespace moert
