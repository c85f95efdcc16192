// The one step loop of a rank's program, for every device: which steps run
// and with how many rows (the batch's tokens, the logit rows after the LM
// head, none for an empty batch except the steps that run empty), and the
// collectives' protocols (Collectives.h) between the steps. A device gives
// the kernels of one step (StepKernels); the CUDA device runs this loop
// inside a graph capture too.
#pragma once

#include "Collectives.h"
#include "moert/Plan.h"

#include <cstdint>
#include <vector>

namespace moert {

/// A device's kernels for one step of its program.
class StepKernels {
public:
  virtual ~StepKernels() = default;
  /// Runs step `index` (not a collective) over `rows` rows; returns the rows
  /// of the steps after it (the LM head: the logit rows).
  virtual int64_t compute(size_t index, const PlanStep &step, int64_t rows) = 0;
  /// Collective step `index` ran; `most`: for an all_to_all, the most rows
  /// any expert received (collectives::run), else -1.
  virtual void exchanged(size_t /*index*/, const PlanStep & /*step*/, int64_t /*most*/) {}
};

/// Runs every step of `c.program` over a batch of `tokens` rows, in order,
/// with `kernels` and the collectives of `c`; returns the rows after the last
/// step. `seconds`, when given (one entry per step), accumulates each step's
/// wall time.
int64_t runSteps(const collectives::Context &c, int64_t tokens, StepKernels &kernels,
                 std::vector<double> *seconds = nullptr);
/// Steps [begin, end) only (a pipeline schedule's fused step runs a
/// program's first receives, or its last sends, apart).
int64_t runSteps(const collectives::Context &c, int64_t tokens, StepKernels &kernels,
                 std::vector<double> *seconds, size_t begin, size_t end);

} // namespace moert
