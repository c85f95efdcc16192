#include "StepLoop.h"
#include "moert/Error.h"
#include "moert/Op.h"

#include <algorithm>
#include <chrono>

namespace moert {

int64_t runSteps(const collectives::Context &c, int64_t tokens, StepKernels &kernels,
                 std::vector<double> *seconds) {
  return runSteps(c, tokens, kernels, seconds, 0, c.program->steps.size());
}

int64_t runSteps(const collectives::Context &c, int64_t tokens, StepKernels &kernels,
                 std::vector<double> *seconds, size_t begin, size_t end) {
  int64_t rows = tokens;
  const std::vector<PlanStep> &steps = c.program->steps;
  for (size_t i = begin; i < std::min(end, steps.size()); ++i) {
    const PlanStep &s = steps[i];
    auto start = std::chrono::steady_clock::now();
    if (s.op->collective != Collective::None) {
      // Every member of the group takes part, with no rows too.
      if (!c.comm)
        runtimeError("{}: {} in a plan of one rank", c.plan->path, collectives::describe(i, s));
      kernels.exchanged(i, s, collectives::run(c, i, s, rows));
    } else if (rows > 0 || s.op->has(OpDef::RunsEmpty)) {
      rows = kernels.compute(i, s, rows);
    }
    if (seconds)
      (*seconds)[i] +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return rows;
}

} // namespace moert
