// split (columns into parts), add and sigmoid_gate.
#include "Ops.h"

#include <algorithm>

namespace moert::ops {
namespace {

void checkSplit(const StepChecker &c, const PlanStep &step) {
  c.expect(step.in.size() == 1 && step.out.size() == step.widths.size() && !step.out.empty(),
           "expected one input and one output per width");
  int64_t sum = 0;
  for (size_t i = 0; i < step.out.size(); ++i) {
    c.expect(c.tokens(step.out[i]) >= step.widths[i] && step.widths[i] > 0,
             "output narrower than its part");
    sum += step.widths[i];
  }
  c.expect(sum == c.tokens(step.in[0]), "widths do not add up to the input width");
}

int64_t runSplit(cpu::StepContext &c) {
  const PlanStep &s = *c.step;
  const int64_t T = c.rows, wd = c.inWidth(0);
  int64_t offset = 0;
  for (size_t i = 0; i < s.out.size(); ++i) {
    const int64_t part = s.widths[i], outWidth = c.width(s.out[i]);
    float *dst = c.out(i);
    const float *src = c.in(0);
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(src + t * wd + offset, part, dst + t * outWidth);
    offset += part;
  }
  return T;
}

void checkAdd(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.expect(c.tokens(step.in[0]) == c.tokens(step.in[1]) &&
               c.tokens(step.out[0]) == c.tokens(step.in[0]),
           "operand widths differ");
}

int64_t runAdd(cpu::StepContext &c) {
  cpu::add(c.in(0), c.in(1), c.rows * c.inWidth(0), c.out(0));
  return c.rows;
}

void checkSigmoidGate(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  c.expect(c.tokens(step.in[1]) == 1 && c.tokens(step.out[0]) == c.tokens(step.in[0]),
           "expected a [T, 1] gate");
}

int64_t runSigmoidGate(cpu::StepContext &c) {
  cpu::sigmoidGate(c.in(0), c.in(1), c.rows, c.inWidth(0), c.out(0));
  return c.rows;
}

} // namespace

const OpDef kSplit = {"split", Collective::None, 0, nullptr, checkSplit, runSplit};
const OpDef kAdd = {"add", Collective::None, 0, nullptr, checkAdd, runAdd};
const OpDef kSigmoidGate = {"sigmoid_gate", Collective::None, 0, nullptr, checkSigmoidGate,
                            runSigmoidGate};

} // namespace moert::ops
