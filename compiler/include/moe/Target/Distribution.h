//===- Distribution.h - a layout as plan JSON -------------------*- C++ -*-===//
//
// The distributed part of a plan: degrees, padded vocabulary, pipeline
// stages and, per rank, its coordinates, predicted memory and the exact
// slices of checkpoint tensors it owns. Ranks whose slices are the same (DP
// replicas: same pp, tp, ep, etp) list them once; the others point at that
// rank with `weights_of_rank`, which keeps a 2048-rank plan small.
//
//===----------------------------------------------------------------------===//
#ifndef MOE_TARGET_DISTRIBUTION_H
#define MOE_TARGET_DISTRIBUTION_H

#include "moe/Analysis/Planner.h"

#include "llvm/Support/JSON.h"

namespace moe {

/// {world_size, degrees, vocab: {size, padded, pad_to}, stage_begin,
///  ranks: [{rank, coords, memory, weights | weights_of_rank}]}
llvm::json::Object distributionJson(const sharding::ModelInfo &model,
                                    const sharding::LayoutEstimate &layout);

/// The same attributes written straight into the object `J` is in: a
/// 2048-rank layout has ~10^5 slices, too many to build as a JSON tree.
/// `without` names attributes to leave out.
void writeDistribution(llvm::json::OStream &J, const sharding::ModelInfo &model,
                       const sharding::LayoutEstimate &layout);

} // namespace moe

#endif // MOE_TARGET_DISTRIBUTION_H
