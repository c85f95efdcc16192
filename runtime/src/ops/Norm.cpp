// rms_norm and layer_norm over rows, and add_norm (a residual add and the
// norm of its sum, as moe-fuse-add-norm makes it).
#include "Ops.h"

namespace moert::ops {
namespace {

void checkNorm(const StepChecker &c, const PlanStep &step, bool layerNorm) {
  c.arity(1, 1, layerNorm ? 2 : 1, 1);
  int64_t w = c.tokens(step.in[0]);
  const PlanWeight &g = c.weight(0, 1);
  c.expect(g.shape[0] > 0 && w % g.shape[0] == 0, "weight size does not divide the width");
  c.expect(!layerNorm || g.shape[0] == w, "layer_norm weight must span the row");
  if (step.weights.size() == 2)
    c.expect(c.weight(1, 1).shape == g.shape, "bias and weight shapes differ");
  c.expect(c.tokens(step.out[0]) == w, "output width differs from the input's");
  c.expect(step.eps > 0, "eps must be > 0");
}

/// rms_norm: in the rows (and, with row_width, their whole rows' sums of
/// squares [T, 1]: a part of rows tensor parallelism splits).
void checkRmsNorm(const StepChecker &c, const PlanStep &step) {
  if (step.rowWidth == 0)
    return checkNorm(c, step, false);
  c.arity(2, 1, 1, 1);
  const int64_t w = c.tokens(step.in[0]);
  c.expect(c.tokens(step.in[1]) == 1, "input 1: expected the rows' sums of squares, [T, 1]");
  c.expect(c.weight(0, 1).shape[0] == w, "with row_width, expected the weight of the part");
  c.expect(step.rowWidth % w == 0, fmt::format("row_width {}: expected a multiple of the "
                                               "part's width {}", step.rowWidth, w));
  c.expect(c.tokens(step.out[0]) == w, "output width differs from the input's");
  c.expect(step.eps > 0, "eps must be > 0");
}

void parseRmsNorm(const JsonFields &a, PlanStep &step) {
  if (a.has("row_width"))
    step.rowWidth = a.bounded("row_width", 1, int64_t(1) << 40);
}

/// row_sum_squares: in [T, D], out [T, 1].
void checkRowSumSquares(const StepChecker &c, const PlanStep &step) {
  c.arity(1, 0, 0, 1);
  c.tokens(step.in[0]);
  c.expect(c.tokens(step.out[0]) == 1, "expected an output of [T, 1]");
}

int64_t runRowSumSquares(cpu::StepContext &c) {
  cpu::rowSumSquares(c.in(0), c.rows, c.inWidth(0), c.out(0));
  return c.rows;
}
void checkLayerNorm(const StepChecker &c, const PlanStep &step) { checkNorm(c, step, true); }

int64_t runRmsNorm(cpu::StepContext &c) {
  if (c.step->rowWidth > 0)
    cpu::rmsNormOfSquares(c.in(0), c.rows, c.inWidth(0), c.weight(0), c.in(1), c.step->rowWidth,
                          c.step->eps, c.out(0));
  else
    cpu::rmsNorm(c.in(0), c.rows, c.inWidth(0), c.weight(0), c.step->eps, c.out(0));
  return c.rows;
}

int64_t runLayerNorm(cpu::StepContext &c) {
  cpu::layerNorm(c.in(0), c.rows, c.inWidth(0), c.weight(0), c.optionalWeight(1), c.step->eps,
                 c.out(0));
  return c.rows;
}

void parseAddNorm(const JsonFields &a, PlanStep &step) {
  const std::string norm = a.string("norm");
  if (norm != "rms_norm" && norm != "layer_norm")
    a.fail("norm", fmt::format("expected \"rms_norm\" or \"layer_norm\" but got \"{}\"", norm));
  step.layerNorm = norm == "layer_norm";
}

/// in: the add's two operands; out: the sum and the normalised rows (one
/// buffer when nothing reads the sum: the rows are normalised in place).
void checkAddNorm(const StepChecker &c, const PlanStep &step) {
  c.arity(2, 1, step.layerNorm ? 2 : 1, 2);
  int64_t w = c.tokens(step.in[0]);
  c.expect(c.tokens(step.in[1]) == w && c.tokens(step.out[0]) == w, "operand widths differ");
  const PlanWeight &g = c.weight(0, 1);
  c.expect(g.shape[0] > 0 && w % g.shape[0] == 0, "weight size does not divide the width");
  c.expect(!step.layerNorm || g.shape[0] == w, "layer_norm weight must span the row");
  if (step.weights.size() == 2)
    c.expect(c.weight(1, 1).shape == g.shape, "bias and weight shapes differ");
  c.expect(c.tokens(step.out[1]) == w, "output width differs from the input's");
  c.expect(step.eps > 0, "eps must be > 0");
}

int64_t runAddNorm(cpu::StepContext &c) {
  const int64_t w = c.inWidth(0);
  float *sum = c.out(0), *out = c.out(1);
  cpu::add(c.in(0), c.in(1), c.rows * w, sum);
  if (c.step->layerNorm)
    cpu::layerNorm(sum, c.rows, w, c.weight(0), c.optionalWeight(1), c.step->eps, out);
  else
    cpu::rmsNorm(sum, c.rows, w, c.weight(0), c.step->eps, out);
  return c.rows;
}

} // namespace

const OpDef kAddNorm = {"add_norm", Collective::None, 0, parseAddNorm, checkAddNorm, runAddNorm};
const OpDef kRmsNorm = {"rms_norm", Collective::None, 0, parseRmsNorm, checkRmsNorm, runRmsNorm};
const OpDef kRowSumSquares = {"row_sum_squares", Collective::None, 0, nullptr, checkRowSumSquares,
                              runRowSumSquares};
const OpDef kLayerNorm = {"layer_norm", Collective::None, 0, nullptr, checkLayerNorm,
                          runLayerNorm};

} // namespace moert::ops
