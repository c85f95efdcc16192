// The structural checks of a plan's programs (internal to the runtime):
// every step's operands against its buffers and weights, the data flow
// between steps and the binding of weights to steps. Plan::load runs them;
// they are what make the executor's indexing safe and what stop a plan
// that computes another model than the one compiled (docs/plan-format.md).
#pragma once

#include "moert/Plan.h"

#include "JsonFields.h"

#include <cstddef>
#include <cstdint>

namespace moert {

/// The number of ranks along `axis` (a collective's group size).
int64_t axisSize(const Degrees &d, CollectiveGroup::Axis axis);
/// Coordinate `axis` of c.
int64_t &axisCoord(RankCoords &c, CollectiveGroup::Axis axis);
/// The two folds of the ranks (docs/partitioned-execution.md).
int64_t attentionRank(const Degrees &d, const RankCoords &c);
int64_t expertRank(const Degrees &d, const RankCoords &c);

/// Shape checks of step `stepIndex` of program `programIndex` against its
/// buffers and weights.
void checkStep(const Plan &plan, const PlanProgram &program, size_t programIndex,
               size_t stepIndex);

/// Data flow: a step reads only buffers an earlier step (or the program's
/// token and position inputs) wrote, and each KV cache is one attention's.
/// `pr` is the program's JSON (for the error's field name).
void checkDataFlow(const PlanProgram &program, const JsonFields &pr);

/// Weight binding: steps bind the program's weights in order (weight 0
/// first, then 1, ...), each weight once; the one weight two steps share is
/// a tied embedding table that the LM head reuses.
void checkWeightBinding(const PlanProgram &program, const JsonFields &pr);

} // namespace moert
