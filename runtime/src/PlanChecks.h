// The structural checks of a plan's programs (internal to the runtime):
// every step's operands against its buffers and weights, the data flow
// between steps and the binding of weights to steps. Plan::load runs them;
// they are what make the executor's indexing safe and what stop a plan
// that computes another model than the one compiled (docs/plan-format.md).
#pragma once

#include "moert/Op.h"
#include "moert/Plan.h"

#include "JsonFields.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace moert {

/// InputError when rank `rank` of `plan` holds weights only the CPU computes
/// with (int8 weights): `device` ("the CUDA device") has no kernels for
/// them, and moec does not write such plans for it.
void refuseCpuOnlyWeights(const Plan &plan, int64_t rank, const char *device);

/// The number of ranks along `axis` (a collective's group size).
int64_t axisSize(const Degrees &d, CollectiveGroup::Axis axis);
/// Coordinate `axis` of c.
int64_t &axisCoord(RankCoords &c, CollectiveGroup::Axis axis);
/// The two folds of the ranks (docs/partitioned-execution.md).
int64_t attentionRank(const Degrees &d, const RankCoords &c);
int64_t expertRank(const Degrees &d, const RankCoords &c);

/// Shape checks of one step of program `programIndex` against its buffers
/// and weights, for an op's OpDef::check. Per-token operands (T <=
/// max_batch_tokens rows) need at least max_batch_tokens rows; dispatch
/// buffers exactly E x C. Every failure is a one-line InputError naming
/// the plan, the program, the step and its op.
class StepChecker {
public:
  StepChecker(const Plan &plan, const PlanProgram &program, size_t programIndex,
              const PlanStep &step, size_t index)
      : plan(plan), program(program), programIndex(programIndex), step(step), index(index) {}

  [[noreturn]] void fail(const std::string &message) const;
  void expect(bool ok, const std::string &message) const {
    if (!ok)
      fail(message);
  }
  /// in inputs, weightsMin..weightsMax weights and out outputs.
  void arity(size_t in, size_t weightsMin, size_t weightsMax, size_t out) const;
  /// The width of a buffer of `dtype`, whatever its rows.
  int64_t width(int64_t buffer, DType dtype = DType::F32) const;
  /// The width of a per-token buffer: one row per token of the batch.
  int64_t tokens(int64_t buffer, DType dtype = DType::F32) const;
  int64_t rows(int64_t buffer) const { return program.buffers[buffer].rows; }
  /// The step's weight i, which must have rank `rankWanted`.
  const PlanWeight &weight(size_t i, size_t rankWanted) const;
  /// The step's KV cache.
  const PlanCache &cache() const;
  /// The size of the step's collective group.
  int64_t groupSize() const { return axisSize(plan.degrees, step.group.axis); }
  /// The [E*C, H] buffers of all_to_all / expert_ffn: E experts (a counts
  /// buffer of 1 row of E) with the same whole number of rows each.
  int64_t experts(int64_t buf, int64_t counts) const;

  const Plan &plan;
  const PlanProgram &program;
  const size_t programIndex;
  const PlanStep &step;
  const size_t index;
};

/// Shape checks of step `stepIndex` of program `programIndex` against its
/// buffers and weights.
void checkStep(const Plan &plan, const PlanProgram &program, size_t programIndex,
               size_t stepIndex);

/// Data flow: a step reads only buffers an earlier step (or the program's
/// token and position inputs) wrote, and each KV cache is one attention's
/// (a recomputed attention writes its forward step's again; `pipelined`:
/// in a stage's backward program, its forward program's). `pr` is the
/// program's JSON (for the error's field name).
void checkDataFlow(const PlanProgram &program, const JsonFields &pr, bool pipelined);

/// Weight binding: steps bind the program's weights in order (weight 0
/// first, then 1, ...), each weight once; the one weight two steps share is
/// a tied embedding table that the LM head reuses.
void checkWeightBinding(const PlanProgram &program, const JsonFields &pr, bool pipelined);

} // namespace moert
