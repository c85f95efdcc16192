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
extern const OpDef kRmsNorm, kLayerNorm, kAddNorm;
// Attention.cpp
extern const OpDef kRope, kAttention, kMlaAttention;
// Elementwise.cpp
extern const OpDef kSplit, kConcat, kAdd, kSigmoidGate;
// Experts.cpp
extern const OpDef kMlp, kRouter, kRoute, kExperts, kDispatch, kExpertFfn, kCombine;
// Loss.cpp
extern const OpDef kCrossEntropy, kRouterStats, kLmLoss;
// Gradients.cpp
extern const OpDef kCrossEntropyGrad, kLinearGrad, kRmsNormGrad, kRopeGrad, kAttentionGrad,
    kMlpGrad, kEmbeddingGrad, kRouteGrad, kExpertsGrad, kRouterStatsGrad, kBiasGrad,
    kSigmoidGateGrad, kMlaAttentionGrad;
// Collective.cpp
extern const OpDef kAllReduce, kAllGather, kAllToAll, kSend, kRecv;

} // namespace moert::ops
