// Every op the runtime knows (moert/Op.h). A new op is one more line here
// and its definition beside the others (docs/adding-an-op.md).
#include "Ops.h"

namespace moert {

const std::vector<const OpDef *> &registeredOps() {
  static const std::vector<const OpDef *> ops = {
      &ops::kEmbedding,  &ops::kRmsNorm,     &ops::kRowSumSquares, &ops::kLayerNorm, &ops::kAddNorm,   &ops::kLinear,
      &ops::kRope,       &ops::kAttention,   &ops::kMlaAttention,
      &ops::kSplit,      &ops::kConcat,      &ops::kAdd,         &ops::kSigmoidGate,
      &ops::kMlp,        &ops::kRouter,      &ops::kRoute,     &ops::kExperts,
      &ops::kExpertsSaved, &ops::kDispatch,
      &ops::kExpertFfn,  &ops::kCombine, &ops::kCombineGrad, &ops::kExpertFfnGrad,
      &ops::kDispatchGrad,
      &ops::kCrossEntropy, &ops::kRouterStats, &ops::kLmLoss, &ops::kVocabStats,
      &ops::kCrossEntropyOfStats,
      &ops::kCrossEntropyGrad, &ops::kLinearGrad, &ops::kRmsNormGrad, &ops::kRmsNormGradStats, &ops::kRopeGrad,
      &ops::kAttentionGrad, &ops::kMlpGrad, &ops::kEmbeddingGrad, &ops::kRouteGrad,
      &ops::kExpertsGrad, &ops::kRouterStatsGrad, &ops::kBiasGrad, &ops::kSigmoidGateGrad,
      &ops::kMlaAttentionGrad,
      &ops::kAccumulate, &ops::kGradTotal, &ops::kCombineStages, &ops::kLrSchedule, &ops::kSumSquares, &ops::kGradNorm, &ops::kAdamW, &ops::kCountExperts,
      &ops::kExpertBiasUpdate,
      &ops::kAllReduce,  &ops::kAllGather,   &ops::kAllToAll, &ops::kReduceScatter,  &ops::kSend,
      &ops::kRecv};
  return ops;
}

const OpDef *findOp(std::string_view name) {
  for (const OpDef *op : registeredOps())
    if (op->name == name)
      return op;
  return nullptr;
}

} // namespace moert
