//===- MoEDialect.cpp - the moe dialect -------------------------*- C++ -*-===//
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

using namespace mlir;
using namespace moe;

#include "moe/Dialect/MoE/IR/MoEDialect.cpp.inc"
#include "moe/Dialect/MoE/IR/MoEEnums.cpp.inc"
#include "moe/Dialect/MoE/IR/MoEInterfaces.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoEAttrs.cpp.inc"

void MoEDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "moe/Dialect/MoE/IR/MoEOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "moe/Dialect/MoE/IR/MoEAttrs.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// Attribute verifiers
//===----------------------------------------------------------------------===//

LogicalResult RopeAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               RopeKind kind, APFloat thetaF, int64_t rotaryDim,
                               bool interleaved, APFloat factorF,
                               int64_t originalMaxPosition, APFloat lowF,
                               APFloat highF, APFloat betaFastF, APFloat betaSlowF,
                               APFloat attentionFactorF, bool truncate) {
  double theta = thetaF.convertToDouble(), factor = factorF.convertToDouble();
  double lowFreqFactor = lowF.convertToDouble();
  double highFreqFactor = highF.convertToDouble();
  double betaFast = betaFastF.convertToDouble();
  double betaSlow = betaSlowF.convertToDouble();
  if (!(theta > 0))
    return emitError() << "expected rope theta > 0 but got " << theta;
  double attentionFactor = attentionFactorF.convertToDouble();
  if (!(attentionFactor > 0) || !std::isfinite(attentionFactor))
    return emitError() << "expected a finite attention_factor > 0 but got "
                       << attentionFactor;
  if (rotaryDim <= 0 || rotaryDim % 2 != 0)
    return emitError() << "expected an even rotary_dim > 0 but got " << rotaryDim;
  if (kind != RopeKind::plain && !(factor > 0))
    return emitError() << "expected rope factor > 0 but got " << factor;
  if ((kind == RopeKind::llama3 || kind == RopeKind::yarn ||
       kind == RopeKind::dynamic) &&
      originalMaxPosition <= 0)
    return emitError() << "expected original_max_position > 0 for "
                       << stringifyRopeKind(kind) << " scaling but got "
                       << originalMaxPosition;
  if (kind == RopeKind::llama3 && !(highFreqFactor > lowFreqFactor))
    return emitError() << "expected high_freq_factor > low_freq_factor but got "
                       << highFreqFactor << " <= " << lowFreqFactor;
  if (kind == RopeKind::yarn && !(betaFast > betaSlow))
    return emitError() << "expected beta_fast > beta_slow but got " << betaFast
                       << " <= " << betaSlow;
  return success();
}

LogicalResult
RoutingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                    ScoringFunc scoring, int64_t topK, TopKInput topkOn,
                    bool normalize, APFloat scalingFactorF, int64_t numGroups,
                    int64_t topkGroups, GroupScore groupScore, Type computeType) {
  double scalingFactor = scalingFactorF.convertToDouble();
  if (topK <= 0)
    return emitError() << "expected top_k > 0 but got " << topK;
  if (!(scalingFactor > 0))
    return emitError() << "expected scaling_factor > 0 but got " << scalingFactor;
  if (numGroups <= 0 || topkGroups <= 0 || topkGroups > numGroups)
    return emitError() << "expected 0 < topk_groups <= num_groups but got "
                       << topkGroups << " of " << numGroups;
  if (topkOn == TopKInput::logits && scoring != ScoringFunc::softmax)
    return emitError() << "expected softmax scoring with topk_on = logits";
  if (!llvm::isa<FloatType>(computeType))
    return emitError() << "expected a float compute_type but got " << computeType;
  return success();
}
