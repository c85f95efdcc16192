// The op definitions (moert/Op.h), one family per file in this directory,
// and the registry (Registry.cpp) that lists them. Only these files name
// model-level ops; docs/adding-an-op.md says what a new op touches.
#pragma once

#include "moert/Error.h"
#include "moert/Op.h"
#include "moert/Plan.h"
#include "moert/cpu/Kernels.h"
#include "moert/cpu/StepContext.h"

#include "../JsonFields.h"
#include "../PlanChecks.h"

#include <fmt/format.h>

namespace moert::ops {

// Embedding.cpp, Linear.cpp
extern const OpDef kEmbedding, kLinear;
// Norm.cpp
extern const OpDef kRmsNorm, kLayerNorm, kAddNorm, kRowSumSquares;
// Attention.cpp
extern const OpDef kRope, kAttention, kMlaAttention;
// Elementwise.cpp
extern const OpDef kSplit, kConcat, kAdd, kSigmoidGate;
// Experts.cpp
extern const OpDef kMlp, kRouter, kRoute, kExperts, kExpertsSaved, kDispatch, kExpertFfn,
    kCombine, kCombineGrad, kExpertFfnGrad, kDispatchGrad;
// Loss.cpp
extern const OpDef kCrossEntropy, kRouterStats, kLmLoss, kVocabStats, kCrossEntropyOfStats;
// Gradients.cpp
extern const OpDef kCrossEntropyGrad, kLinearGrad, kRmsNormGrad, kRmsNormGradStats, kRopeGrad, kAttentionGrad,
    kMlpGrad, kEmbeddingGrad, kRouteGrad, kExpertsGrad, kRouterStatsGrad, kBiasGrad,
    kSigmoidGateGrad, kMlaAttentionGrad;
// Optimizer.cpp
extern const OpDef kAccumulate, kGradTotal, kCombineStages, kLrSchedule, kSumSquares, kGradNorm, kAdamW, kCountExperts, kExpertBiasUpdate;
// Experts.cpp: the optional capacity_factor of experts_saved and experts_grad
// (PlanStep::dispatch.capacityFactor; 0: dropless).
void parseExpertsCapacity(const JsonFields &a, PlanStep &step);
// Experts.cpp: moe.experts_saved's saved activations (its outputs, moe.experts_grad's
// inputs): per token k blocks of the intermediate (gate, up) and of hidden (output).
void checkSavedActivations(const StepChecker &c, int64_t gate, int64_t up, int64_t output,
                           int64_t k, int64_t intermediate, int64_t hidden);
// Gradients.cpp: a weight gradient's output: a static f32 buffer of the
// weight's shape (its last dimension wide, the others its rows: a vector one
// row, an expert stack [E, out, in] E x out rows).
void expectWeightGradient(const StepChecker &c, int64_t buffer, const PlanWeight &w);
// Collective.cpp
extern const OpDef kAllReduce, kAllGather, kAllToAll, kReduceScatter, kSend, kRecv;

} // namespace moert::ops
