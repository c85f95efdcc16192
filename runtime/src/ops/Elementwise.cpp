// split (columns into parts), concat (parts into columns), add and
// sigmoid_gate.
#include "Ops.h"

#include <algorithm>

namespace moert::ops {
namespace {

/// split and concat: the `parts` buffers hold consecutive column ranges of
/// `whole` (`widths` wide each). `partsAreOutputs`: split.
void checkParts(const StepChecker &c, const PlanStep &step, bool partsAreOutputs) {
  const std::vector<int64_t> &parts = partsAreOutputs ? step.out : step.in;
  const std::vector<int64_t> &whole = partsAreOutputs ? step.in : step.out;
  const char *part = partsAreOutputs ? "output" : "input";
  c.expect(whole.size() == 1 && parts.size() == step.widths.size() && !parts.empty() &&
               step.weights.empty(),
           fmt::format("expected one {} and one {} per width", partsAreOutputs ? "input" : "output",
                       part));
  int64_t sum = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    c.expect(c.tokens(parts[i]) >= step.widths[i] && step.widths[i] > 0,
             fmt::format("{} narrower than its part", part));
    sum += step.widths[i];
  }
  c.expect(sum == c.tokens(whole[0]), fmt::format("widths do not add up to the {} width",
                                                  partsAreOutputs ? "input" : "output"));
}

/// Copies the columns of `whole` to or from the parts.
int64_t copyParts(cpu::StepContext &c, bool partsAreOutputs) {
  const PlanStep &s = *c.step;
  const std::vector<int64_t> &parts = partsAreOutputs ? s.out : s.in;
  const int64_t whole = partsAreOutputs ? s.in[0] : s.out[0];
  const int64_t T = c.rows, wd = c.width(whole);
  int64_t offset = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t part = s.widths[i], partWidth = c.width(parts[i]);
    float *w = c.f(whole), *p = c.f(parts[i]);
    for (int64_t t = 0; t < T; ++t) {
      if (partsAreOutputs)
        std::copy_n(w + t * wd + offset, part, p + t * partWidth);
      else
        std::copy_n(p + t * partWidth, part, w + t * wd + offset);
    }
    offset += part;
  }
  return T;
}

void checkSplit(const StepChecker &c, const PlanStep &step) { checkParts(c, step, true); }
int64_t runSplit(cpu::StepContext &c) { return copyParts(c, true); }
void checkConcat(const StepChecker &c, const PlanStep &step) { checkParts(c, step, false); }
int64_t runConcat(cpu::StepContext &c) { return copyParts(c, false); }

void parseAdd(const JsonFields &a, PlanStep &step) {
  if (a.has("elements"))
    step.elements = a.integer("elements", 1);
}

void checkAdd(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 0, 0, 1);
  if (step.elements > 0) {
    for (int64_t b : {step.in[0], step.in[1], step.out[0]})
      c.expect(c.rows(b) * c.width(b) == step.elements,
               fmt::format("buffer {} does not hold the {} elements", b, step.elements));
    return;
  }
  c.expect(c.tokens(step.in[0]) == c.tokens(step.in[1]) &&
               c.tokens(step.out[0]) == c.tokens(step.in[0]),
           "operand widths differ");
}

int64_t runAdd(cpu::StepContext &c) {
  const int64_t n = c.step->elements > 0 ? c.step->elements : c.rows * c.inWidth(0);
  cpu::add(c.in(0), c.in(1), n, c.out(0));
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
const OpDef kConcat = {"concat", Collective::None, 0, nullptr, checkConcat, runConcat};
const OpDef kAdd = {"add", Collective::None, 0, parseAdd, checkAdd, runAdd};
const OpDef kSigmoidGate = {"sigmoid_gate", Collective::None, 0, nullptr, checkSigmoidGate,
                            runSigmoidGate};

} // namespace moert::ops
